package prepare

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/kvtop/kvtop/engine/pages"
)

// ErrBadMetadata is returned for a kv_append_metadata string that does not decode.
var ErrBadMetadata = errors.New("prepare: bad kv_append_metadata")

// Encode returns the kv_append_metadata string of a flattened append-position array, as MLC
// writes it (docs/kv-cache.md): the array as compact JSON, prefixed by its byte length as an 8-byte
// little-endian unsigned integer, the whole in standard padded base64.
// Encode([]int64{1, 0, 39}) is "CAAAAAAAAABbMSwwLDM5XQ==".
func Encode(arr []int64) string {
	buf := make([]byte, 8, 8+2+len(arr)*8)
	buf = append(buf, '[')
	for i, v := range arr {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendInt(buf, v, 10)
	}
	buf = append(buf, ']')
	binary.LittleEndian.PutUint64(buf, uint64(len(buf)-8))
	return base64.StdEncoding.EncodeToString(buf)
}

// maxMetadataBytes bounds what Decode accepts: far more than any real reservation (a
// 1M-token prompt on 1-token pages is about 16 MB of JSON), and small enough that a hostile
// string cannot make the decoder allocate without bound.
const maxMetadataBytes = 64 << 20

// Decode parses a kv_append_metadata string back into the flattened array and checks that it
// splits into per-model groups [n, start_1, len_1, …] (see Split). It refuses bad base64, a
// truncated blob, a length prefix that disagrees with the payload, anything but a JSON array
// of integers, and groups that do not split; it never panics.
func Decode(s string) ([]int64, error) {
	if base64.StdEncoding.DecodedLen(len(s)) > maxMetadataBytes {
		return nil, fmt.Errorf("%w: %d base64 characters is over the limit", ErrBadMetadata, len(s))
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: base64: %v", ErrBadMetadata, err)
	}
	if len(raw) < 8 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the 8-byte length prefix", ErrBadMetadata, len(raw))
	}
	n := binary.LittleEndian.Uint64(raw)
	body := raw[8:]
	if n != uint64(len(body)) {
		return nil, fmt.Errorf("%w: length prefix says %d bytes, payload has %d", ErrBadMetadata, n, len(body))
	}
	arr, err := parseIntArray(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadMetadata, err)
	}
	if _, err := Split(arr); err != nil {
		return nil, err
	}
	return arr, nil
}

// parseIntArray parses a JSON array of integers: MLC's compact form, with JSON whitespace
// tolerated.
func parseIntArray(b []byte) ([]int64, error) {
	i := 0
	skip := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	skip()
	if i >= len(b) || b[i] != '[' {
		return nil, errors.New("payload is not a JSON array")
	}
	i++
	skip()
	arr := []int64{}
	if i < len(b) && b[i] == ']' {
		i++
	} else {
		for {
			skip()
			start := i
			if i < len(b) && b[i] == '-' {
				i++
			}
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				i++
			}
			v, err := strconv.ParseInt(string(b[start:i]), 10, 64)
			if err != nil || (i-start > 1 && b[start] == '0') || (i-start > 2 && b[start] == '-' && b[start+1] == '0') {
				return nil, fmt.Errorf("element %d at byte %d is not an integer", len(arr), start)
			}
			arr = append(arr, v)
			skip()
			if i < len(b) && b[i] == ',' {
				i++
				continue
			}
			if i < len(b) && b[i] == ']' {
				i++
				break
			}
			return nil, fmt.Errorf("expected ',' or ']' at byte %d", i)
		}
	}
	skip()
	if i != len(b) {
		return nil, fmt.Errorf("trailing bytes after the array at byte %d", i)
	}
	return arr, nil
}

// Metadata is a decoded append-position map: for each model, the runs of consecutive slots
// that the prefill instance writes, in token order.
type Metadata [][]pages.Run

// Split cuts a flattened array into its per-model groups [n, start_1, len_1, …, start_n,
// len_n]. Every run length must be at least 1 and every start at least 0, except that a
// single unwritable slot of a sliding window is the run [-1, 1] (MLC's sliding window, not modelled yet).
func Split(arr []int64) (Metadata, error) {
	if len(arr) == 0 {
		return nil, fmt.Errorf("%w: empty array", ErrBadMetadata)
	}
	var md Metadata
	for i := 0; i < len(arr); {
		n := arr[i]
		if n < 0 || n > int64(len(arr)-i-1)/2 {
			return nil, fmt.Errorf("%w: group at %d says %d runs, %d ints follow", ErrBadMetadata, i, n, len(arr)-i-1)
		}
		runs := make([]pages.Run, 0, n)
		for k := range n {
			start, l := arr[i+1+2*int(k)], arr[i+2+2*int(k)]
			if l < 1 || start < -1 || (start == -1 && l != 1) {
				return nil, fmt.Errorf("%w: run [%d, %d] of group %d", ErrBadMetadata, start, l, len(md))
			}
			runs = append(runs, pages.Run{Start: start, Len: l})
		}
		md = append(md, runs)
		i += 1 + 2*int(n)
	}
	return md, nil
}

// Flatten returns the array form of md: the groups concatenated in model order.
func (md Metadata) Flatten() []int64 {
	var arr []int64
	for _, runs := range md {
		arr = append(arr, int64(len(runs)))
		for _, r := range runs {
			arr = append(arr, r.Start, r.Len)
		}
	}
	return arr
}

// Tokens returns how many tokens the first model's runs cover (every model covers the same
// tokens).
func (md Metadata) Tokens() int64 {
	if len(md) == 0 {
		return 0
	}
	var n int64
	for _, r := range md[0] {
		n += r.Len
	}
	return n
}
