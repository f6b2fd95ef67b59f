package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Encoding is how events are laid out in a batch's msgpack.
type Encoding uint8

const (
	// Map lays each event out as a map with a "type" key and its fields by name: vLLM's
	// current encoding.
	Map Encoding = iota
	// Array lays each event out as an array, its tag first and then its fields in order:
	// vLLM's older encoding (msgspec's array_like tagged structs).
	Array
)

func (e Encoding) String() string {
	switch e {
	case Map:
		return "map"
	case Array:
		return "array"
	}
	return fmt.Sprintf("encoding(%d)", uint8(e))
}

// ParseEncoding reads an encoding's name.
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "map":
		return Map, nil
	case "array":
		return Array, nil
	}
	return 0, fmt.Errorf("kvevents: unknown encoding %q (map or array)", s)
}

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("kvevents: malformed batch")

// Encode writes a batch in msgpack: the batch as an array [ts, events, data_parallel_rank]
// (the rank left out when the batch has none), its events laid out by enc.
func Encode(b Batch, enc Encoding) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	n := 2
	if b.HasDPRank {
		n = 3
	}
	must := func(err error) {
		if err != nil {
			panic(err) // bytes.Buffer does not fail
		}
	}
	must(e.EncodeArrayLen(n))
	must(e.EncodeFloat64(b.TS))
	must(e.EncodeArrayLen(len(b.Events)))
	for _, ev := range b.Events {
		if err := encodeEvent(e, ev, enc); err != nil {
			return nil, err
		}
	}
	if b.HasDPRank {
		must(e.EncodeInt(b.DPRank))
	}
	return buf.Bytes(), nil
}

func encodeEvent(e *msgpack.Encoder, ev Event, enc Encoding) error {
	type field struct {
		name string
		put  func() error
	}
	var fields []field
	switch v := ev.(type) {
	case BlockStored:
		fields = []field{
			{"block_hashes", func() error { return encodeHashes(e, v.BlockHashes) }},
			{"parent_block_hash", func() error { return encodeHashPtr(e, v.ParentBlockHash) }},
			{"token_ids", func() error {
				if err := e.EncodeArrayLen(len(v.TokenIDs)); err != nil {
					return err
				}
				for _, t := range v.TokenIDs {
					if err := e.EncodeInt(t); err != nil {
						return err
					}
				}
				return nil
			}},
			{"block_size", func() error { return e.EncodeInt(v.BlockSize) }},
			{"lora_id", func() error { return encodeIntPtr(e, v.LoraID) }},
			{"medium", func() error { return encodeStringPtr(e, v.Medium) }},
			{"lora_name", func() error { return encodeStringPtr(e, v.LoraName) }},
		}
	case BlockRemoved:
		fields = []field{
			{"block_hashes", func() error { return encodeHashes(e, v.BlockHashes) }},
			{"medium", func() error { return encodeStringPtr(e, v.Medium) }},
		}
	case AllBlocksCleared:
	default:
		return fmt.Errorf("kvevents: cannot encode %s", ev.Type())
	}
	var err error
	if enc == Array {
		err = e.EncodeArrayLen(1 + len(fields))
	} else {
		if err = e.EncodeMapLen(1 + len(fields)); err == nil {
			err = e.EncodeString("type")
		}
	}
	if err == nil {
		err = e.EncodeString(ev.Type())
	}
	for _, f := range fields {
		if err != nil {
			break
		}
		if enc == Map {
			if err = e.EncodeString(f.name); err != nil {
				break
			}
		}
		err = f.put()
	}
	return err
}

func encodeHashes(e *msgpack.Encoder, hs []Hash) error {
	if err := e.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := encodeHash(e, h); err != nil {
			return err
		}
	}
	return nil
}

func encodeHash(e *msgpack.Encoder, h Hash) error {
	if h.Bytes != nil {
		return e.EncodeBytes(h.Bytes)
	}
	return e.EncodeUint(h.N)
}

func encodeHashPtr(e *msgpack.Encoder, h *Hash) error {
	if h == nil {
		return e.EncodeNil()
	}
	return encodeHash(e, *h)
}

func encodeIntPtr(e *msgpack.Encoder, n *int64) error {
	if n == nil {
		return e.EncodeNil()
	}
	return e.EncodeInt(*n)
}

func encodeStringPtr(e *msgpack.Encoder, s *string) error {
	if s == nil {
		return e.EncodeNil()
	}
	return e.EncodeString(*s)
}

// Decode reads a batch from any vLLM-format publisher (vLLM, SGLang, TensorRT-LLM, kvtop):
// the batch as an array [ts, events] or [ts, events, data_parallel_rank], or as a map with
// those keys; each event as a map with a "type" key or as a tagged array. Unknown fields
// and trailing array elements are ignored, an event of an unknown type decodes as Unknown,
// and a hash may be an integer or bytes.
func Decode(payload []byte) (Batch, error) {
	d := &decoder{r: bytes.NewReader(payload)}
	d.d = msgpack.NewDecoder(d.r)
	b, err := d.batch()
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if d.r.Len() > 0 {
		return Batch{}, fmt.Errorf("%w: %d bytes after the batch", ErrMalformed, d.r.Len())
	}
	if math.IsNaN(b.TS) || math.IsInf(b.TS, 0) {
		return Batch{}, fmt.Errorf("%w: timestamp %v", ErrMalformed, b.TS)
	}
	return b, nil
}

type decoder struct {
	r *bytes.Reader
	d *msgpack.Decoder
}

// length reads an array's or a map's length and checks it against what is left: every
// element takes a byte at least, so a length beyond that is a lie, not an allocation.
func (d *decoder) length(mapLen bool) (int, error) {
	var n int
	var err error
	if mapLen {
		n, err = d.d.DecodeMapLen()
	} else {
		n, err = d.d.DecodeArrayLen()
	}
	if err != nil {
		return 0, err
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("length %d with %d bytes left", n, d.r.Len())
	}
	return max(n, 0), nil
}

func (d *decoder) peek() (byte, error) { return d.d.PeekCode() }

func isMap(c byte) bool { return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 }
func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func (d *decoder) batch() (Batch, error) {
	var b Batch
	c, err := d.peek()
	if err != nil {
		return b, err
	}
	if isMap(c) {
		n, err := d.length(true)
		if err != nil {
			return b, err
		}
		for range n {
			k, err := d.d.DecodeString()
			if err != nil {
				return b, err
			}
			switch k {
			case "ts":
				b.TS, err = d.d.DecodeFloat64()
			case "events":
				b.Events, err = d.events()
			case "data_parallel_rank":
				b.DPRank, b.HasDPRank, err = d.optInt()
			default:
				err = d.d.Skip()
			}
			if err != nil {
				return b, fmt.Errorf("batch %s: %w", k, err)
			}
		}
		return b, nil
	}
	n, err := d.length(false)
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, fmt.Errorf("a batch of %d fields, want ts and events at least", n)
	}
	if b.TS, err = d.d.DecodeFloat64(); err != nil {
		return b, fmt.Errorf("batch ts: %w", err)
	}
	if b.Events, err = d.events(); err != nil {
		return b, err
	}
	if n > 2 {
		if b.DPRank, b.HasDPRank, err = d.optInt(); err != nil {
			return b, fmt.Errorf("batch data_parallel_rank: %w", err)
		}
	}
	return b, d.skip(n - 3)
}

func (d *decoder) skip(n int) error {
	for range n {
		if err := d.d.Skip(); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.length(false)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	out := make([]Event, 0, n)
	for i := range n {
		ev, err := d.event()
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// fields are an event's fields, whatever its type.
type fields struct {
	hashes    []Hash
	parent    *Hash
	tokens    []int64
	blockSize int64
	loraID    *int64
	medium    *string
	loraName  *string
}

// positions are the fields of each tagged-array event, in order.
var positions = map[string][]string{
	TagBlockStored:      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
	TagBlockRemoved:     {"block_hashes", "medium"},
	TagAllBlocksCleared: {},
}

func (d *decoder) event() (Event, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	var f fields
	var tag string
	switch {
	case isMap(c):
		n, err := d.length(true)
		if err != nil {
			return nil, err
		}
		for range n {
			k, err := d.d.DecodeString()
			if err != nil {
				return nil, err
			}
			if k == "type" {
				tag, err = d.d.DecodeString()
			} else {
				err = d.field(&f, k)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
		}
		if tag == "" {
			return nil, errors.New("an event with no type")
		}
	case isArray(c):
		n, err := d.length(false)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, errors.New("an empty event")
		}
		if tag, err = d.d.DecodeString(); err != nil {
			return nil, fmt.Errorf("tag: %w", err)
		}
		names := positions[tag] // none for an unknown tag: all skipped
		for i := 1; i < n; i++ {
			name := ""
			if i-1 < len(names) {
				name = names[i-1]
			}
			if err := d.field(&f, name); err != nil {
				return nil, fmt.Errorf("%s field %d: %w", tag, i, err)
			}
		}
	default:
		return nil, fmt.Errorf("an event of msgpack code %#x, want a map or an array", c)
	}
	switch tag {
	case TagBlockStored:
		return BlockStored{BlockHashes: f.hashes, ParentBlockHash: f.parent, TokenIDs: f.tokens, BlockSize: f.blockSize,
			LoraID: f.loraID, Medium: f.medium, LoraName: f.loraName}, nil
	case TagBlockRemoved:
		return BlockRemoved{BlockHashes: f.hashes, Medium: f.medium}, nil
	case TagAllBlocksCleared:
		return AllBlocksCleared{}, nil
	}
	return Unknown{Tag: tag}, nil
}

// field reads the field called name into f; an unknown one is skipped.
func (d *decoder) field(f *fields, name string) error {
	var err error
	switch name {
	case "block_hashes":
		f.hashes, err = d.hashes()
	case "parent_block_hash":
		f.parent, err = d.optHash()
	case "token_ids":
		var n int
		if n, err = d.length(false); err != nil {
			return err
		}
		f.tokens = make([]int64, n)
		for i := range f.tokens {
			if f.tokens[i], err = d.d.DecodeInt64(); err != nil {
				return err
			}
		}
	case "block_size":
		f.blockSize, err = d.d.DecodeInt64()
	case "lora_id":
		var n int64
		var ok bool
		if n, ok, err = d.optInt(); ok {
			f.loraID = &n
		}
	case "medium":
		f.medium, err = d.optString()
	case "lora_name":
		f.loraName, err = d.optString()
	default:
		err = d.d.Skip()
	}
	return err
}

func (d *decoder) isNil() (bool, error) {
	c, err := d.peek()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, d.d.DecodeNil()
	}
	return false, nil
}

func (d *decoder) optInt() (int64, bool, error) {
	if null, err := d.isNil(); null || err != nil {
		return 0, false, err
	}
	n, err := d.d.DecodeInt64()
	return n, err == nil, err
}

func (d *decoder) optString() (*string, error) {
	if null, err := d.isNil(); null || err != nil {
		return nil, err
	}
	s, err := d.d.DecodeString()
	if err != nil {
		return nil, err
	}
	return &s, nil
}

func (d *decoder) hashes() ([]Hash, error) {
	n, err := d.length(false)
	if err != nil {
		return nil, err
	}
	out := make([]Hash, n)
	for i := range out {
		if out[i], err = d.hash(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *decoder) optHash() (*Hash, error) {
	if null, err := d.isNil(); null || err != nil {
		return nil, err
	}
	h, err := d.hash()
	if err != nil {
		return nil, err
	}
	return &h, nil
}

// hash reads an integer (signed ones keep their bits) or bytes (a string too).
func (d *decoder) hash() (Hash, error) {
	c, err := d.peek()
	if err != nil {
		return Hash{}, err
	}
	switch {
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := d.d.DecodeBytes()
		if b == nil {
			b = []byte{}
		}
		return Hash{Bytes: b}, err
	case c == msgpcode.Nil:
		return Hash{}, errors.New("a null hash")
	}
	n, err := d.d.DecodeUint64()
	return Hash{N: n}, err
}
