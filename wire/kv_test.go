package wire_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/wire"
)

// The reproduction of issue 11 through the API: with no recycling, C is prepared, written
// and finished; D is prepared on C's old pages. A write with C's metadata at KV-Offset 16
// is refused with 409 naming both, counts nothing toward D, and raises a stale-kv-write
// hazard; D's own metadata still writes.
func TestStaleKVWriteIs409AndFlagged(t *testing.T) {
	h := newHarness(t, setup{cfg: func(c *engine.Config) { c.MaxRecycling = 0 }})
	c := h.prepRecv("C", prompt(40, 1), -1, 2)
	if status, b := h.writeKV(c.KVAppendMetadata, -1, 0, nil); status != http.StatusOK {
		t.Fatalf("C's KV write = %d %s", status, b)
	}
	h.startGenerate("C", 39)
	d := h.prepRecv("D", prompt(40, 2), -1, 2)
	if d.KVAppendMetadata == c.KVAppendMetadata {
		t.Fatalf("D's metadata is C's: the test needs them apart")
	}
	status, b := h.writeKV(c.KVAppendMetadata, 16, 0, nil)
	if status != http.StatusConflict || !strings.Contains(string(b), `"type":"stale_kv_write"`) ||
		!strings.Contains(string(b), "issued to C, which is finished") || !strings.Contains(string(b), "belong to D") {
		t.Errorf("KV write with C's metadata at offset 16 = %d %s, want 409 stale_kv_write naming C and D", status, b)
	}
	if rv := h.request("D"); rv.Received != 0 {
		t.Errorf("D received %d KV tokens from C's stale write", rv.Received)
	}
	snap := h.snapshot()
	if n := snap.Totals.Hazards[engine.HazardStaleKVWrite]; n != 1 {
		t.Errorf("stale-kv-write hazards = %d, want 1", n)
	}
	if hz := snap.Hazards[len(snap.Hazards)-1].Hazard; hz.Kind != engine.HazardStaleKVWrite || hz.ID != "C" || hz.Holder != "D" || hz.Offset != 16 {
		t.Errorf("last hazard = %+v, want stale-kv-write of C's metadata at 16 over D", hz)
	}
	// Metadata no request was ever given is stale too.
	if status, b := h.writeKV(prepare.Encode([]int64{1, 100, 5}), -1, 0, nil); status != http.StatusConflict {
		t.Errorf("KV write with metadata never issued = %d %s, want 409", status, b)
	}
	if status, b := h.writeKV(d.KVAppendMetadata, -1, 0, nil); status != http.StatusOK {
		t.Errorf("D's own KV write = %d %s, want 200", status, b)
	}
}

// rawKV sends a KV write with a Content-Length but only the first bytes of its body, or
// (contentLength < 0) a whole chunked body, and returns the answer the server gives without
// waiting for the rest.
func rawKV(t *testing.T, h *harness, md string, contentLength int64, body string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", h.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	length := fmt.Sprintf("Content-Length: %d\r\n", contentLength)
	if contentLength < 0 {
		length = "Transfer-Encoding: chunked\r\n"
		body = fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	}
	fmt.Fprintf(conn, "POST /v1/kv HTTP/1.1\r\nHost: %s\r\n%s: %s\r\nContent-Type: application/octet-stream\r\n%s\r\n%s",
		h.ts.Listener.Addr(), wire.HeaderKVMetadata, md, length, body)
	// A server that read the body before the headers would wait for bytes that never come.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A KV write's headers are checked before its body is read: bad metadata, a body on an
// engine with no arena, or a length that is not the tokens' is refused at once, with the
// body (60 MB, say) still unsent. (A chunked body's length is not known before it is read:
// the one with no arena is refused from its first byte.)
func TestKVHeadersAreCheckedBeforeTheBody(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Limits.MaxKVBytes = 64 << 20 }})
	a := h.prepRecv("A", prompt(40, 1), -1, 2)
	for _, tc := range []struct {
		name   string
		md     string
		length int64
		want   string
	}{
		{"garbage metadata", "!!!garbage", 60 << 20, "bad_metadata"},
		{"a body with no arena", a.KVAppendMetadata, 60 << 20, "must be empty"},
		{"a chunked body with no arena", a.KVAppendMetadata, -1, "must be empty"},
	} {
		if status, b := rawKV(t, h, tc.md, tc.length, "kv"); status != http.StatusBadRequest || !strings.Contains(b, tc.want) {
			t.Errorf("%s = %d %s, want 400 %q", tc.name, status, b, tc.want)
		}
	}
	if rv := h.request("A"); rv.Received != 0 {
		t.Errorf("A received %d KV tokens from refused writes", rv.Received)
	}
}

// With an arena, a body whose length is not a whole number of tokens is refused from its
// Content-Length before the body is sent, and one over --max-kv-body is 413.
func TestKVBodyLengthIsCheckedFirst(t *testing.T) {
	geom := pages.Geometry{Layers: 1, KVHeads: 1, HeadDim: 8} // 32 bytes a token
	h := newHarness(t, setup{
		cfg:  func(c *engine.Config) { c.Arena = geom },
		opts: func(o *wire.Options) { o.Limits.MaxKVBytes = 10 * 32 },
	})
	a := h.prepRecv("A", prompt(40, 1), -1, 2)
	if status, b := rawKV(t, h, a.KVAppendMetadata, 60<<20+1, "k"); status != http.StatusBadRequest || !strings.Contains(b, "not a whole number of tokens") {
		t.Errorf("a body of 60 MB and a byte = %d %s, want 400", status, b)
	}
	if status, b := rawKV(t, h, a.KVAppendMetadata, 20*32, strings.Repeat("k", 20*32)); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a body of 20 tokens over a limit of 10 = %d %s, want 413", status, b)
	}
	if status, b := h.writeKV(a.KVAppendMetadata, 0, 0, make([]byte, 10*32)); status != http.StatusOK {
		t.Errorf("a body of 10 tokens = %d %s, want 200", status, b)
	}
}
