package wire

import (
	"slices"
	"testing"
)

func TestParseTokenTextReadsTokenText(t *testing.T) {
	ids := []int32{0, 1, 15, 16, 17, 255, 31999, 1<<31 - 1}
	text := ""
	for _, id := range ids {
		text += TokenText(id)
	}
	got, err := ParseTokenText(text)
	if err != nil || !slices.Equal(got, ids) {
		t.Errorf("ParseTokenText(%q) = %v, %v, want %v", text, got, err, ids)
	}
	for _, bad := range []string{" k", " xx", " kalolomi nupe x"} {
		if _, err := ParseTokenText(bad); err == nil {
			t.Errorf("ParseTokenText(%q) = nil error", bad)
		}
	}
}
