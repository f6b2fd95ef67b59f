package prepare

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

func TestEncodeSpecVectors(t *testing.T) {
	for _, tc := range []struct {
		arr  []int64
		want string
	}{
		{[]int64{1, 0, 39}, "CAAAAAAAAABbMSwwLDM5XQ=="},
		{[]int64{1, 48, 23}, "CQAAAAAAAABbMSw0OCwyM10="},
		{[]int64{1, 52, 19}, "CQAAAAAAAABbMSw1MiwxOV0="},
		{[]int64{3, 16, 16, 0, 16, 32, 8}, "EwAAAAAAAABbMywxNiwxNiwwLDE2LDMyLDhd"},
		{[]int64{1, 38, 1}, "CAAAAAAAAABbMSwzOCwxXQ=="},
		{[]int64{0}, "AwAAAAAAAABbMF0="},
	} {
		got := Encode(tc.arr)
		if got != tc.want {
			t.Errorf("Encode(%v) = %q, want %q", tc.arr, got, tc.want)
		}
		back, err := Decode(got)
		if err != nil || !slices.Equal(back, tc.arr) {
			t.Errorf("Decode(%q) = %v, %v, want %v", got, back, err, tc.arr)
		}
	}
}

// blob builds a metadata string from a raw payload and a length prefix.
func blob(prefix uint64, payload string) string {
	b := binary.LittleEndian.AppendUint64(nil, prefix)
	return base64.StdEncoding.EncodeToString(append(b, payload...))
}

func TestDecodeRefusesMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"not base64", "!!!!"},
		{"unpadded", "CAAAAAAAAABbMSwwLDM5XQ"},
		{"plain base64 of the JSON", "WzEsMCwzOV0="},
		{"truncated blob", base64.StdEncoding.EncodeToString([]byte{8, 0, 0})},
		{"prefix too long", blob(9, "[1,0,39]")},
		{"prefix too short", blob(7, "[1,0,39]")},
		{"prefix huge", blob(1<<63, "[1,0,39]")},
		{"not an array", blob(7, `{"a":1}`)},
		{"float", blob(10, "[1,0,39.5]")},
		{"string", blob(10, `[1,0,"39"]`)},
		{"leading zero", blob(9, "[1,0,039]")},
		{"trailing comma", blob(9, "[1,0,39,]")},
		{"trailing bytes", blob(9, "[1,0,39]x")},
		{"overflow", blob(26, "[1,0,99999999999999999999]")},
		{"empty array", blob(2, "[]")},
		{"n too large", blob(8, "[2,0,39]")},
		{"n negative", blob(5, "[-1,0]")},
		{"leftover int", blob(10, "[1,0,39,5]")},
		{"zero-length run", blob(7, "[1,0,0]")},
		{"negative start", blob(8, "[1,-5,3]")},
		{"long unwritable run", blob(8, "[1,-1,2]")},
	} {
		if got, err := Decode(tc.in); !errors.Is(err, ErrBadMetadata) {
			t.Errorf("Decode(%s) = %v, %v, want ErrBadMetadata", tc.name, got, err)
		}
	}
}

func TestDecodeToleratesWhitespaceAndGroups(t *testing.T) {
	got, err := Decode(blob(20, "[ 1, 0, 39, 1,0,39 ]"))
	if err != nil || !slices.Equal(got, []int64{1, 0, 39, 1, 0, 39}) {
		t.Errorf("Decode with spaces and two models = %v, %v", got, err)
	}
	md, _ := Split(got)
	if !slices.Equal(md.Flatten(), got) {
		t.Errorf("Split(%v).Flatten() = %v", got, md.Flatten())
	}
	if got, err := Decode(blob(8, "[1,-1,1]")); err != nil || !slices.Equal(got, []int64{1, -1, 1}) {
		t.Errorf("Decode of an unwritable sliding-window slot = %v, %v, want [1 -1 1]", got, err)
	}
}

// FuzzDecode: the decoder never panics, and what it accepts re-encodes to an equivalent
// string that decodes to the same array.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{"CAAAAAAAAABbMSwwLDM5XQ==", "EwAAAAAAAABbMywxNiwxNiwwLDE2LDMyLDhd", "AwAAAAAAAABbMF0=", "WzEsMCwzOV0=", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		arr, err := Decode(s)
		if err != nil {
			if !errors.Is(err, ErrBadMetadata) {
				t.Fatalf("Decode(%q) error %v is not ErrBadMetadata", s, err)
			}
			return
		}
		back, err := Decode(Encode(arr))
		if err != nil || !slices.Equal(back, arr) {
			t.Fatalf("Decode(Encode(%v)) = %v, %v", arr, back, err)
		}
	})
}

// FuzzEncodeRoundTrip: decode(encode(x)) == x for every array that splits (invariant 10.8).
func FuzzEncodeRoundTrip(f *testing.F) {
	f.Add([]byte{1, 0, 39})
	f.Add([]byte{3, 16, 16, 0, 16, 32, 8})
	f.Fuzz(func(t *testing.T, b []byte) {
		arr := make([]int64, len(b))
		for i, v := range b {
			arr[i] = int64(v)
		}
		if _, err := Split(arr); err != nil {
			return
		}
		got, err := Decode(Encode(arr))
		if err != nil || !slices.Equal(got, arr) {
			t.Fatalf("Decode(Encode(%v)) = %v, %v", arr, got, err)
		}
	})
}
