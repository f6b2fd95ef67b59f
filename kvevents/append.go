package kvevents

import (
	"encoding/binary"
	"math"

	"github.com/kvtop/kvtop/engine/blocks"
)

// The publisher's own encoder: a batch of block changes appended to a buffer as msgpack,
// byte for byte what Encode writes for the same events (a test holds the two together), but
// with no Event values, no encoder and no buffer of its own. The sender encodes every batch
// the engine makes, so this is what keeps its allocations, and the collections they cost
// the engine's goroutine, to the payload it keeps.

// appendBatch appends the batch [ts, events, dpRank] of the changes, blocks of ps tokens.
func appendBatch(b []byte, ts float64, chs []blocks.Change, ps int, dpRank int64, enc Encoding) []byte {
	b = appendArrayLen(b, 3)
	b = append(b, 0xcb)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(ts))
	b = appendArrayLen(b, len(chs))
	for i := range chs {
		b = appendChange(b, &chs[i], ps, enc)
	}
	return appendInt(b, dpRank)
}

func appendChange(b []byte, ch *blocks.Change, ps int, enc Encoding) []byte {
	var typ string
	var fields int
	switch ch.Kind {
	case blocks.Stored:
		typ, fields = "BlockStored", 7
	case blocks.Removed:
		typ, fields = "BlockRemoved", 2
	default:
		typ = "AllBlocksCleared"
	}
	field := func(b []byte, name string) []byte {
		if enc == Map {
			b = appendString(b, name)
		}
		return b
	}
	if enc == Array {
		b = appendArrayLen(b, 1+fields)
	} else {
		b = appendMapLen(b, 1+fields)
		b = appendString(b, "type")
	}
	b = appendString(b, typ)
	switch ch.Kind {
	case blocks.Stored:
		b = field(b, "block_hashes")
		b = appendHashes(b, ch.Hashes)
		b = field(b, "parent_block_hash")
		if ch.HasParent {
			b = appendUint(b, ch.Parent)
		} else {
			b = append(b, 0xc0)
		}
		b = field(b, "token_ids")
		b = appendArrayLen(b, len(ch.Tokens))
		for _, t := range ch.Tokens {
			b = appendInt(b, int64(t))
		}
		b = field(b, "block_size")
		b = appendInt(b, int64(ps))
		b = field(b, "lora_id")
		b = append(b, 0xc0)
		b = field(b, "medium")
		b = appendString(b, MediumGPU)
		b = field(b, "lora_name")
		b = append(b, 0xc0)
	case blocks.Removed:
		b = field(b, "block_hashes")
		b = appendHashes(b, ch.Hashes)
		b = field(b, "medium")
		b = appendString(b, MediumGPU)
	}
	return b
}

func appendHashes(b []byte, hs []uint64) []byte {
	b = appendArrayLen(b, len(hs))
	for _, h := range hs {
		b = appendUint(b, h)
	}
	return b
}

// The integer and length forms msgpack's Encoder picks: the shortest.

func appendUint(b []byte, n uint64) []byte {
	switch {
	case n <= math.MaxInt8:
		return append(b, byte(n))
	case n <= math.MaxUint8:
		return append(b, 0xcc, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(n))
	case n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), n)
}

func appendInt(b []byte, n int64) []byte {
	switch {
	case n >= 0:
		return appendUint(b, uint64(n))
	case n >= -32:
		return append(b, byte(n))
	case n >= math.MinInt8:
		return append(b, 0xd0, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(n))
}

func appendArrayLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func appendMapLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}

func appendString(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 256:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}
