package wire

import (
	"bytes"
	"encoding/json"
	"math"
)

// fastPrepRecv reads a prep_recv body of the usual form without generic JSON decoding for
// its prompt: an object whose keys are plain ASCII, none given twice (in any case), and
// whose prompt is an array of integers in the int32 range, which it parses straight into
// the engine's token ids. The other fields' values go to encoding/json, one by one, as the
// body's struct fields would. It reports false for anything else, and for anything wrong
// (a syntax error, a type error, a token out of range): the caller then decodes the body
// with encoding/json, which says what is wrong. What it accepts it reads as encoding/json
// reads it (FuzzFastPrepRecv).
func fastPrepRecv(b []byte) (body prepRecvBody, prompt []int32, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return body, nil, false
	}
	i = skipSpace(b, i+1)
	var seen [6]bool // which of the body's fields were given, in prepRecvFields' order
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			key, j, ok := plainKey(b, i)
			if !ok {
				return body, nil, false
			}
			j = skipSpace(b, j)
			if j >= len(b) || b[j] != ':' {
				return body, nil, false
			}
			j = skipSpace(b, j+1)
			f := fieldOf(key)
			if f >= 0 {
				if seen[f] {
					return body, nil, false // encoding/json keeps the last; leave it to it
				}
				seen[f] = true
			}
			if f == fieldPrompt {
				if prompt, j, ok = tokenArray(b, j); !ok {
					return body, nil, false
				}
			} else {
				end, ok := valueEnd(b, j)
				if !ok {
					return body, nil, false
				}
				if v := fieldValue(&body, f); v != nil {
					if json.Unmarshal(b[j:end], v) != nil {
						return body, nil, false
					}
				} else if !json.Valid(b[j:end]) {
					return body, nil, false
				}
				j = end
			}
			i = skipSpace(b, j)
			if i < len(b) && b[i] == ',' {
				i = skipSpace(b, i+1)
				continue
			}
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			return body, nil, false
		}
	}
	if skipSpace(b, i) != len(b) {
		return body, nil, false
	}
	return body, prompt, true
}

// The fields of prepRecvBody, by index.
const (
	fieldModel = iota
	fieldPrompt
	fieldEnd
	fieldUser
	fieldMaxTokens
	fieldN
)

var prepRecvFields = [...]string{"model", "prompt", "end", "user", "max_tokens", "n"}

// fieldOf returns the field a key names, matched as encoding/json matches an ASCII key
// (without regard to case), or -1.
func fieldOf(key []byte) int {
	for f, name := range prepRecvFields {
		if len(key) == len(name) && bytes.EqualFold(key, []byte(name)) {
			return f
		}
	}
	return -1
}

// fieldValue returns where field f's value goes in body, or nil for an unknown field.
func fieldValue(body *prepRecvBody, f int) any {
	switch f {
	case fieldModel:
		return &body.Model
	case fieldEnd:
		return &body.End
	case fieldUser:
		return &body.User
	case fieldMaxTokens:
		return &body.MaxTokens
	case fieldN:
		return &body.N
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// plainKey reads the object key at b[i]: a string of printable ASCII without escapes.
func plainKey(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c < 0x20 || c >= 0x80 || c == '\\':
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// valueEnd returns where the JSON value at b[i] ends, respecting strings and nesting; it
// does not validate (encoding/json does).
func valueEnd(b []byte, i int) (int, bool) {
	depth := 0
	for j := i; j < len(b); j++ {
		switch c := b[j]; c {
		case '"':
			for j++; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
				}
			}
			if j >= len(b) {
				return 0, false
			}
			if depth == 0 {
				return j + 1, true
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return j, j > i // the end of the enclosing object
			}
			if depth--; depth == 0 {
				return j + 1, true
			}
		case ',', ' ', '\n', '\r', '\t':
			if depth == 0 {
				return j, j > i
			}
		}
	}
	return len(b), depth == 0 && len(b) > i
}

// tokenArray parses the JSON array of integers at b[i] into token ids: each a JSON
// integer (no fraction, no exponent) within the int32 range. It reports false for anything
// else, null elements included.
func tokenArray(b []byte, i int) ([]int32, int, bool) {
	if i >= len(b) || b[i] != '[' {
		return nil, 0, false
	}
	end := bytes.IndexByte(b[i:], ']')
	if end < 0 {
		return nil, 0, false
	}
	out := make([]int32, 0, bytes.Count(b[i:i+end], []byte{','})+1)
	j := skipSpace(b, i+1)
	if j < len(b) && b[j] == ']' {
		return out, j + 1, true
	}
	for {
		neg := false
		if j < len(b) && b[j] == '-' {
			neg = true
			j++
		}
		start := j
		var v uint64 // wraps only for more digits than are taken
		for j < len(b) {
			c := b[j] - '0'
			if c > 9 {
				break
			}
			v = v*10 + uint64(c)
			j++
		}
		if n := j - start; n == 0 || n > 10 || n > 1 && b[start] == '0' {
			return nil, 0, false // not an integer, out of range, or a leading zero
		}
		if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
			return nil, 0, false
		}
		if v > math.MaxInt32+1 || v == math.MaxInt32+1 && !neg {
			return nil, 0, false
		}
		id := int32(v)
		if neg {
			id = int32(-int64(v))
		}
		out = append(out, id)
		if j < len(b) && b[j] == ',' {
			j++
		} else {
			j = skipSpace(b, j)
			if j >= len(b) {
				return nil, 0, false
			}
			switch b[j] {
			case ',':
				j++
			case ']':
				return out, j + 1, true
			default:
				return nil, 0, false
			}
		}
		j = skipSpace(b, j)
	}
}
