package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
)

// Batch is one message of a publisher: vLLM's EventBatch, sent as one ZMQ message
// [topic, seq, payload] whose payload is the batch in msgpack.
type Batch struct {
	// TS is when the batch was made, in seconds since the Unix epoch.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank of the engine that published it; HasDPRank is false
	// when the batch did not say.
	DPRank    int64
	HasDPRank bool
}

// Event is one KV cache event. The set is closed: BlockStored, BlockRemoved,
// AllBlocksCleared, and Unknown for a type this package does not know.
type Event interface {
	// Type is the event's tag, as vLLM names it ("BlockStored").
	Type() string
	isEvent()
}

// Hash is a block hash as publishers send it: an integer (kvtop's, and vLLM's when it is
// configured so) or bytes (vLLM's sha256 hashes). Bytes is nil for an integer.
type Hash struct {
	N     uint64
	Bytes []byte
}

// IntHash returns the hash of an integer.
func IntHash(n uint64) Hash { return Hash{N: n} }

func (h Hash) String() string {
	if h.Bytes != nil {
		return hex.EncodeToString(h.Bytes)
	}
	return strconv.FormatUint(h.N, 10)
}

// Equal reports whether two hashes are the same.
func (h Hash) Equal(o Hash) bool {
	if (h.Bytes == nil) != (o.Bytes == nil) {
		return false
	}
	if h.Bytes != nil {
		return string(h.Bytes) == string(o.Bytes)
	}
	return h.N == o.N
}

// MarshalJSON writes an integer hash as a number and a bytes hash as a hex string.
func (h Hash) MarshalJSON() ([]byte, error) {
	if h.Bytes != nil {
		return json.Marshal(hex.EncodeToString(h.Bytes))
	}
	return []byte(strconv.FormatUint(h.N, 10)), nil
}

// BlockStored says that blocks came into the cache: BlockHashes in order, each the child of
// the one before it, the first the child of ParentBlockHash (none for a prefix that starts
// at the first token). TokenIDs are their tokens, BlockSize of them a block.
type BlockStored struct {
	BlockHashes     []Hash  `json:"block_hashes"`
	ParentBlockHash *Hash   `json:"parent_block_hash"`
	TokenIDs        []int64 `json:"token_ids"`
	BlockSize       int64   `json:"block_size"`
	LoraID          *int64  `json:"lora_id"`
	Medium          *string `json:"medium"`
	LoraName        *string `json:"lora_name"`
}

// BlockRemoved says that blocks left the cache.
type BlockRemoved struct {
	BlockHashes []Hash  `json:"block_hashes"`
	Medium      *string `json:"medium"`
}

// AllBlocksCleared says that every block left the cache.
type AllBlocksCleared struct{}

// Unknown is an event of a type this package does not know; decoding keeps its tag only.
type Unknown struct{ Tag string }

// The tags.
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

func (BlockStored) Type() string      { return TagBlockStored }
func (BlockRemoved) Type() string     { return TagBlockRemoved }
func (AllBlocksCleared) Type() string { return TagAllBlocksCleared }
func (u Unknown) Type() string        { return u.Tag }

func (BlockStored) isEvent()      {}
func (BlockRemoved) isEvent()     {}
func (AllBlocksCleared) isEvent() {}
func (Unknown) isEvent()          {}

// MediumGPU is the medium kvtop's blocks live in, as vLLM names the tier a router cares for.
const MediumGPU = "GPU"

// Describe returns an event in one line.
func Describe(ev Event) string {
	switch e := ev.(type) {
	case BlockStored:
		parent := "none"
		if e.ParentBlockHash != nil {
			parent = e.ParentBlockHash.String()
		}
		return fmt.Sprintf("BlockStored %d blocks after %s, %d tokens of %d a block", len(e.BlockHashes), parent, len(e.TokenIDs), e.BlockSize)
	case BlockRemoved:
		return fmt.Sprintf("BlockRemoved %d blocks", len(e.BlockHashes))
	}
	return ev.Type()
}
