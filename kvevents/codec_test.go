package kvevents

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func strp(s string) *string { return &s }
func intp(n int64) *int64   { return &n }
func hashp(n uint64) *Hash  { h := IntHash(n); return &h }

func sample() Batch {
	return Batch{TS: 1700000000.25, DPRank: 0, HasDPRank: true, Events: []Event{
		AllBlocksCleared{},
		BlockStored{BlockHashes: []Hash{IntHash(1<<63 + 5), IntHash(7)}, TokenIDs: []int64{1, 2, 3, 4}, BlockSize: 2, Medium: strp(MediumGPU)},
		BlockStored{BlockHashes: []Hash{IntHash(9)}, ParentBlockHash: hashp(7), TokenIDs: []int64{-1, 6}, BlockSize: 2,
			LoraID: intp(3), Medium: strp(MediumGPU), LoraName: strp("adapter")},
		BlockRemoved{BlockHashes: []Hash{IntHash(9), IntHash(7)}, Medium: strp(MediumGPU)},
	}}
}

// Both encodings decode to what was encoded.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, enc := range []Encoding{Map, Array} {
		b := sample()
		raw, err := Encode(b, enc)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(raw)
		if err != nil {
			t.Fatalf("%v: Decode(Encode(b)) = %v", enc, err)
		}
		if !reflect.DeepEqual(got, b) {
			t.Errorf("%v: Decode(Encode(b)) = %+v, want %+v", enc, got, b)
		}
	}
}

// The layouts are vLLM's: the batch an array [ts, events, rank]; a map event keyed by field
// name with its tag under "type"; an array event its tag first, then its fields in order.
func TestEncodingsAreVLLMs(t *testing.T) {
	b := Batch{TS: 2, DPRank: 1, HasDPRank: true, Events: []Event{
		BlockStored{BlockHashes: []Hash{IntHash(5)}, TokenIDs: []int64{8}, BlockSize: 1, Medium: strp("GPU")},
		BlockRemoved{BlockHashes: []Hash{IntHash(5)}, Medium: strp("GPU")},
		AllBlocksCleared{},
	}}
	for _, c := range []struct {
		enc  Encoding
		want []any
	}{
		{Map, []any{2.0, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{int64(5)}, "parent_block_hash": nil, "token_ids": []any{int64(8)},
				"block_size": int64(1), "lora_id": nil, "medium": "GPU", "lora_name": nil},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{int64(5)}, "medium": "GPU"},
			map[string]any{"type": "AllBlocksCleared"},
		}, int64(1)}},
		{Array, []any{2.0, []any{
			[]any{"BlockStored", []any{int64(5)}, nil, []any{int64(8)}, int64(1), nil, "GPU", nil},
			[]any{"BlockRemoved", []any{int64(5)}, "GPU"},
			[]any{"AllBlocksCleared"},
		}, int64(1)}},
	} {
		raw, err := Encode(b, c.enc)
		if err != nil {
			t.Fatal(err)
		}
		var got []any
		d := msgpack.NewDecoder(bytes.NewReader(raw))
		d.UseLooseInterfaceDecoding(true)
		if err := d.Decode(&got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%v: Encode(b) decodes generically to\n%#v\nwant\n%#v", c.enc, got, c.want)
		}
	}
}

func pack(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// What other publishers send decodes: a map batch, fields kvtop does not know (vLLM's
// extra_keys, group_idx, kv_cache_spec_kind), bytes hashes, extra array elements, events of
// unknown types, a batch without a rank.
func TestDecodeAcceptsOtherPublishers(t *testing.T) {
	raw := pack(t, map[string]any{
		"ts": 12, "data_parallel_rank": 2, "something_new": []int{1},
		"events": []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte{0xab, 0xcd}}, "parent_block_hash": nil,
				"token_ids": []int{1, 2}, "block_size": 2, "lora_id": nil, "medium": "GPU", "lora_name": nil,
				"extra_keys": []any{nil}, "group_idx": 0, "kv_cache_spec_kind": "full_attention"},
			[]any{"BlockRemoved", []any{int64(-3)}, "CPU", "a later field"},
			map[string]any{"type": "BlockMoved", "to": "disk"},
		},
	})
	got, err := Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := Batch{TS: 12, DPRank: 2, HasDPRank: true, Events: []Event{
		BlockStored{BlockHashes: []Hash{{Bytes: []byte{0xab, 0xcd}}}, TokenIDs: []int64{1, 2}, BlockSize: 2, Medium: strp("GPU")},
		BlockRemoved{BlockHashes: []Hash{IntHash(^uint64(2))}, Medium: strp("CPU")},
		Unknown{Tag: "BlockMoved"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Decode = %+v\nwant %+v", got, want)
	}
	got, err = Decode(pack(t, []any{1.5, []any{[]any{"AllBlocksCleared"}}}))
	if err != nil || got.HasDPRank || len(got.Events) != 1 || got.TS != 1.5 {
		t.Errorf("Decode([1.5, [[AllBlocksCleared]]]) = %+v, %v; want one event, no rank", got, err)
	}
}

// Malformed input is an error wrapping ErrMalformed, never a panic or a huge allocation.
func TestDecodeRefusesMalformedBatches(t *testing.T) {
	for name, raw := range map[string][]byte{
		"empty":            nil,
		"not a batch":      pack(t, "hello"),
		"one field":        pack(t, []any{1.0}),
		"event not a map":  pack(t, []any{1.0, []any{7}}),
		"event no type":    pack(t, []any{1.0, []any{map[string]any{"block_hashes": []int{1}}}}),
		"null hash":        pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{nil}, nil}}}),
		"trailing bytes":   append(pack(t, []any{1.0, []any{}}), 0xc0),
		"a length it lies": {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"truncated":        pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2, 3}}}})[:9],
	} {
		if b, err := Decode(raw); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Decode = %+v, %v; want ErrMalformed", name, b, err)
		}
	}
}

// FuzzDecode: Decode never panics, and what it accepts survives a round trip through
// either encoding (Unknown events aside, which cannot be encoded).
func FuzzDecode(f *testing.F) {
	for _, enc := range []Encoding{Map, Array} {
		raw, _ := Encode(sample(), enc)
		f.Add(raw)
	}
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90})
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := Decode(raw)
		if err != nil {
			return
		}
		for _, ev := range b.Events {
			if _, ok := ev.(Unknown); ok {
				return
			}
		}
		for _, enc := range []Encoding{Map, Array} {
			again, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("Encode(Decode(raw)) = %v", err)
			}
			b2, err := Decode(again)
			if err != nil {
				t.Fatalf("Decode(Encode(Decode(raw))) = %v", err)
			}
			if !reflect.DeepEqual(normal(b2), normal(b)) {
				t.Fatalf("%v: the round trip changed the batch:\n%+v\n%+v", enc, b2, b)
			}
		}
	})
}

// normal makes empty slices nil, which an encoding cannot tell apart.
func normal(b Batch) Batch {
	if len(b.Events) == 0 {
		b.Events = nil
	}
	for i, ev := range b.Events {
		switch e := ev.(type) {
		case BlockStored:
			if len(e.BlockHashes) == 0 {
				e.BlockHashes = nil
			}
			if len(e.TokenIDs) == 0 {
				e.TokenIDs = nil
			}
			b.Events[i] = e
		case BlockRemoved:
			if len(e.BlockHashes) == 0 {
				e.BlockHashes = nil
			}
			b.Events[i] = e
		}
	}
	return b
}
