package wire_test

import (
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/wire"
)

// FuzzDecodePrepRecv feeds prep_recv bodies to the decoder and what it accepts to a small
// engine: neither may panic, and what the decoder accepts is within its bounds. The seed
// corpus is in testdata/fuzz/FuzzDecodePrepRecv.
func FuzzDecodePrepRecv(f *testing.F) {
	f.Add([]byte(`{"user":"A","prompt":[1,2,3],"end":-1,"max_tokens":4}`))
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength = 512
	cfg.Watermark = 0
	now := time.UnixMilli(1)
	f.Fuzz(func(t *testing.T, b []byte) {
		pr, err := wire.DecodePrepRecv(b, 100)
		if err != nil {
			return
		}
		if pr.MaxTokens < 0 || pr.MaxTokens > 100 || pr.N < 0 {
			t.Fatalf("DecodePrepRecv(%q) = %+v, outside its bounds", b, pr)
		}
		e, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.PrepRecv(now, pr); err != nil {
			return
		}
		e.Step(now)
		if err := e.Check(); err != nil {
			t.Fatalf("after %q: %v", b, err)
		}
	})
}

// FuzzParseKVWrite feeds KV write headers to the parser: it must not panic, and what it
// accepts is a run of slots from the metadata that the body's length covers exactly.
func FuzzParseKVWrite(f *testing.F) {
	f.Add(prepare.Encode([]int64{1, 0, 39}), "", "", int64(0), 1, 0)
	f.Add(prepare.Encode([]int64{1, 0, 39, 1, 0, 39}), "20", "", int64(19*64), 2, 32)
	f.Fuzz(func(t *testing.T, md, offset, tokens string, bodyLen int64, models, tokenBytes int) {
		if models < 1 || models > 4 || tokenBytes < 0 || tokenBytes > 1<<20 {
			return
		}
		g := wire.KVGeometry{Models: models, TokenBytes: tokenBytes, Slots: 513 * 16}
		slots, err := wire.ParseKVWrite(md, offset, tokens, bodyLen, g)
		if err != nil {
			return
		}
		if len(slots) == 0 || int64(len(slots)) > g.Slots {
			t.Fatalf("ParseKVWrite(%q, %q, %q) = %d slots", md, offset, tokens, len(slots))
		}
		if want := int64(len(slots)) * int64(models) * int64(tokenBytes); bodyLen != want {
			t.Fatalf("ParseKVWrite accepted a body of %d bytes for %d slots (want %d)", bodyLen, len(slots), want)
		}
	})
}
