package vectors

import (
	"bufio"
	"compress/gzip"
	"embed"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

//go:embed testdata/*.gz
var files embed.FS

// ErrSyntax is returned for a file that does not follow the script format.
var ErrSyntax = errors.New("vectors: syntax error")

// Script is one script of a vector file: a header and the operations to replay on one fresh
// instance.
type Script struct {
	Header string // the header line without its "## "
	Line   int    // the header's line number in the file, from 1
	Ops    []Op
}

// Op is one operation of a script and the answer the upstream code gave.
type Op struct {
	Line   int      // line number in the file, from 1
	Name   string   // the operation: the first word of the line
	Args   []string // the words between the name and "=>"
	Answer string   // what follows "=>", without surrounding spaces
}

// String returns the line the operation was read from, with its line number.
func (o Op) String() string {
	s := o.Name
	if len(o.Args) > 0 {
		s += " " + strings.Join(o.Args, " ")
	}
	return fmt.Sprintf("line %d: %s => %s", o.Line, s, o.Answer)
}

// Load returns the scripts of one embedded vector file, named as upstream names it
// ("kvcache.txt", "prefix.txt", "unordered_map.txt", "engine.txt").
func Load(name string) ([]Script, error) {
	f, err := files.Open("testdata/" + name + ".gz")
	if err != nil {
		return nil, fmt.Errorf("vectors: %w", err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("vectors: %s: %w", name, err)
	}
	scripts, err := Parse(z)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return scripts, nil
}

// Parse reads scripts in the vector format.
func Parse(r io.Reader) ([]Script, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<26) // a prompt of a million tokens fits on one line
	var (
		out []Script
		cur *Script
	)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimRight(sc.Text(), " \r")
		switch {
		case text == "":
			cur = nil
		case strings.HasPrefix(text, "## "):
			if cur != nil {
				return nil, fmt.Errorf("line %d: header inside a script begun at line %d: %w", line, cur.Line, ErrSyntax)
			}
			out = append(out, Script{Header: text[3:], Line: line})
			cur = &out[len(out)-1]
		case strings.HasPrefix(text, "#"):
		case cur == nil:
			return nil, fmt.Errorf("line %d: operation outside a script: %w", line, ErrSyntax)
		default:
			op, err := parseOp(text)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			op.Line = line
			cur.Ops = append(cur.Ops, op)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("vectors: %w", err)
	}
	return out, nil
}

func parseOp(text string) (Op, error) {
	call, answer, ok := strings.Cut(text, " =>")
	if !ok {
		return Op{}, fmt.Errorf("%q has no \"=>\": %w", text, ErrSyntax)
	}
	words := strings.Fields(call)
	if len(words) == 0 {
		return Op{}, fmt.Errorf("%q has no operation: %w", text, ErrSyntax)
	}
	return Op{Name: words[0], Args: words[1:], Answer: strings.TrimSpace(answer)}, nil
}

// Ints parses a comma-separated list of integers; "-" is the empty list.
func Ints[T int32 | int64 | int](s string) ([]T, error) {
	if s == "-" {
		return nil, nil
	}
	bits := 64
	switch any(T(0)).(type) {
	case int32:
		bits = 32
	case int:
		bits = strconv.IntSize
	}
	parts := strings.Split(s, ",")
	out := make([]T, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, bits)
		if err != nil {
			return nil, fmt.Errorf("vectors: list %q: %w", s, err)
		}
		out[i] = T(v)
	}
	return out, nil
}
