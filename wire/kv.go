package wire

import (
	"net/http"
	"slices"
	"strconv"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
)

// The headers of a KV write (POST /v1/kv). The body is the raw KV bytes.
const (
	// HeaderKVMetadata carries the kv_append_metadata string prep_recv answered, untouched.
	HeaderKVMetadata = "KV-Append-Metadata"
	// HeaderKVOffset is the index, in the metadata's expanded slot list, of the first token
	// the body holds (default 0), so a large transfer can come in several writes.
	HeaderKVOffset = "KV-Offset"
	// HeaderKVTokens is how many tokens the write covers. Default: with a zero-sized arena,
	// every slot from the offset on; otherwise what the body's length says.
	HeaderKVTokens = "KV-Tokens"
)

// KVGeometry is what a KV write is checked against: the engine's models, the bytes of one
// token's KV in one model (0 for a zero-sized arena), and the pool's slot count.
type KVGeometry struct {
	Models     int
	TokenBytes int
	Slots      int64
}

// ParseKVWrite turns a KV write's headers and body length into the slots it writes, in
// order: the metadata's slots (model 0's; every model's must be the same) from offset on,
// tokens of them. The body must hold tokens × models × TokenBytes bytes, for each token
// each model's KV in turn. It refuses anything else with the reason; it never panics and
// never allocates more than the pool's slot count.
func ParseKVWrite(metadata, offset, tokens string, bodyLen int64, g KVGeometry) ([]int64, error) {
	md, off, n, err := parseKVRange(metadata, offset, tokens, bodyLen, g)
	if err != nil {
		return nil, err
	}
	slots := pages.Expand(make([]int64, 0, off+n), md)
	return slots[off : off+n], nil
}

// parseKVRange checks a KV write as ParseKVWrite does and returns model 0's runs and the
// range of their expanded slot list the write covers, without expanding them.
func parseKVRange(metadata, offset, tokens string, bodyLen int64, g KVGeometry) ([]pages.Run, int64, int64, error) {
	const call = "kv write"
	fail := func(err error) ([]pages.Run, int64, int64, error) { return nil, 0, 0, err }
	if bodyLen < 0 {
		return fail(errorf(http.StatusBadRequest, "bad_kv_write", "%s: a body of %d bytes", call, bodyLen))
	}
	if metadata == "" {
		return fail(errorf(http.StatusBadRequest, "bad_metadata", "%s: the %s header is required (the kv_append_metadata prep_recv answered)", call, HeaderKVMetadata))
	}
	arr, err := prepare.Decode(metadata)
	if err != nil {
		return fail(errorf(http.StatusBadRequest, "bad_metadata", "%s: %s: %v", call, HeaderKVMetadata, err))
	}
	md, err := prepare.Split(arr)
	if err != nil {
		return fail(errorf(http.StatusBadRequest, "bad_metadata", "%s: %s: %v", call, HeaderKVMetadata, err))
	}
	if len(md) != g.Models {
		return fail(errorf(http.StatusBadRequest, "bad_metadata", "%s: the metadata has %d model groups; the engine has %d models", call, len(md), g.Models))
	}
	for m := 1; m < len(md); m++ {
		if !slices.Equal(md[m], md[0]) {
			return fail(errorf(http.StatusBadRequest, "bad_metadata", "%s: model %d's slots differ from model 0's; kvtop's models share one page layout", call, m))
		}
	}
	var total int64
	for _, r := range md[0] {
		total += r.Len
		if total > g.Slots {
			return fail(errorf(http.StatusBadRequest, "bad_kv_write", "%s: the metadata covers more tokens than the pool's %d slots", call, g.Slots))
		}
	}
	off, err := headerInt(call, HeaderKVOffset, offset, 0)
	if err != nil {
		return fail(err)
	}
	if off < 0 || off >= total {
		return fail(errorf(http.StatusBadRequest, "bad_kv_write", "%s: %s %d must be in [0, %d), the metadata's %d tokens", call, HeaderKVOffset, off, total, total))
	}
	per := int64(g.Models) * int64(g.TokenBytes)
	var n int64
	switch {
	case tokens != "":
		if n, err = headerInt(call, HeaderKVTokens, tokens, 0); err != nil {
			return fail(err)
		}
		if n < 1 || off+n > total {
			return fail(errorf(http.StatusBadRequest, "bad_kv_write", "%s: %s %d must be in [1, %d] from offset %d of %d tokens", call, HeaderKVTokens, n, total-off, off, total))
		}
	case per == 0:
		n = total - off
	default:
		if bodyLen <= 0 || bodyLen%per != 0 {
			return fail(errorf(http.StatusBadRequest, "bad_kv_write", "%s: a body of %d bytes is not a whole number of tokens (%d models × %d bytes a token)", call, bodyLen, g.Models, g.TokenBytes))
		}
		n = min(bodyLen/per, total-off+1) // one too many is refused below
	}
	if per == 0 && bodyLen != 0 {
		return fail(errorf(http.StatusBadRequest, "bad_kv_write", "%s: the engine keeps no KV payload (zero-sized arena), so the body must be empty; it has %d bytes", call, bodyLen))
	}
	if off+n > total {
		return fail(errorf(http.StatusBadRequest, "bad_kv_write", "%s: the body holds %d tokens from offset %d; the metadata has %d", call, bodyLen/per, off, total))
	}
	if want := n * per; bodyLen != want {
		return fail(errorf(http.StatusBadRequest, "bad_kv_write", "%s: the body has %d bytes; %d tokens × %d models × %d bytes a token is %d", call, bodyLen, n, g.Models, g.TokenBytes, want))
	}
	return md[0], off, n, nil
}

func headerInt(call, name, v string, def int64) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errorf(http.StatusBadRequest, "bad_kv_write", "%s: %s %q is not an integer", call, name, v)
	}
	return n, nil
}
