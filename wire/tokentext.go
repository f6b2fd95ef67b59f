package wire

import (
	"fmt"
	"strings"
)

// ParseTokenText reads back the token ids TokenText wrote: each token is a space and its
// base-16 digits as syllables. A simulated router uses it to put a completion's tokens into
// its next prompt, as a chat client sends the answer back.
func ParseTokenText(text string) ([]int32, error) {
	var out []int32
	for _, word := range strings.Split(text, " ") {
		if word == "" {
			continue
		}
		if len(word)%2 != 0 || len(word) > 16 {
			return nil, fmt.Errorf("wire: %q is not a token's text", word)
		}
		var id int64
		for i := 0; i < len(word); i += 2 {
			d := -1
			for k, s := range syllables {
				if word[i:i+2] == s {
					d = k
					break
				}
			}
			if d < 0 {
				return nil, fmt.Errorf("wire: %q is not a token's text", word)
			}
			id = id*16 + int64(d)
		}
		if id > 1<<31-1 {
			return nil, fmt.Errorf("wire: %q is out of range", word)
		}
		out = append(out, int32(id))
	}
	return out, nil
}
