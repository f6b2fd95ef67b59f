package vectors

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := `# a comment before any script

## kv seed 1: 4 pages of 16
kv_create 4 16 => ok
# a comment inside a script
kv_copies => -
erase 2 => | buckets 13
evict 3 =>

## second
kv_fork 0 1 5 => ERR Check failed: x => y
`
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatalf("Parse() error = %v", err)
	}
	want := []Script{
		{Header: "kv seed 1: 4 pages of 16", Line: 3, Ops: []Op{
			{Line: 4, Name: "kv_create", Args: []string{"4", "16"}, Answer: "ok"},
			{Line: 6, Name: "kv_copies", Args: []string{}, Answer: "-"},
			{Line: 7, Name: "erase", Args: []string{"2"}, Answer: "| buckets 13"},
			{Line: 8, Name: "evict", Args: []string{"3"}, Answer: ""},
		}},
		{Header: "second", Line: 10, Ops: []Op{
			{Line: 11, Name: "kv_fork", Args: []string{"0", "1", "5"}, Answer: "ERR Check failed: x => y"},
		}},
	}
	if len(got) != len(want) {
		t.Fatalf("Parse() = %d scripts, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Header != w.Header || g.Line != w.Line || len(g.Ops) != len(w.Ops) {
			t.Fatalf("script %d = %q at %d with %d ops, want %q at %d with %d", i, g.Header, g.Line, len(g.Ops), w.Header, w.Line, len(w.Ops))
		}
		for j := range w.Ops {
			if g.Ops[j].String() != w.Ops[j].String() || !slices.Equal(g.Ops[j].Args, w.Ops[j].Args) {
				t.Errorf("script %d op %d = %v %q, want %v %q", i, j, g.Ops[j], g.Ops[j].Args, w.Ops[j], w.Ops[j].Args)
			}
		}
	}
}

func TestParseRefusesBadScripts(t *testing.T) {
	for _, in := range []string{
		"kv_add 0 => ok\n",             // no header
		"## a\nkv_add 0\n",             // no answer
		"## a\n## b\nkv_add 0 => ok\n", // header inside a script
		"## a\n => ok\n",               // no operation
		"## a\nok\n\nkv_add 0 => ok\n", // the first script's bad line
	} {
		if _, err := Parse(strings.NewReader(in)); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) error = %v, want ErrSyntax", in, err)
		}
	}
}

// Every embedded file loads, with the number of scripts its README gives, each opening with
// a configuration and holding operations.
func TestLoad(t *testing.T) {
	for name, n := range map[string]int{"kvcache.txt": 400, "prefix.txt": 400, "unordered_map.txt": 56, "engine.txt": 150} {
		scripts, err := Load(name)
		if err != nil {
			t.Fatalf("Load(%q) error = %v", name, err)
		}
		if len(scripts) != n {
			t.Errorf("Load(%q) = %d scripts, want %d", name, len(scripts), n)
		}
		for _, s := range scripts {
			if len(s.Ops) == 0 {
				t.Errorf("Load(%q): script at line %d (%q) has no operations", name, s.Line, s.Header)
			}
		}
	}
	if _, err := Load("missing.txt"); err == nil {
		t.Errorf("Load(%q) error = nil, want one", "missing.txt")
	}
}

func TestInts(t *testing.T) {
	if got, err := Ints[int32]("8,-14,2147483647"); err != nil || !slices.Equal(got, []int32{8, -14, 2147483647}) {
		t.Errorf("Ints[int32](8,-14,2147483647) = %v, %v", got, err)
	}
	if got, err := Ints[int64]("-"); err != nil || len(got) != 0 {
		t.Errorf("Ints[int64](-) = %v, %v, want empty", got, err)
	}
	for _, bad := range []string{"", "1,,2", "x", "2147483648"} {
		if got, err := Ints[int32](bad); err == nil {
			t.Errorf("Ints[int32](%q) = %v, want an error", bad, got)
		}
	}
	if got, err := Ints[int]("4096,16"); err != nil || !slices.Equal(got, []int{4096, 16}) {
		t.Errorf("Ints[int](4096,16) = %v, %v", got, err)
	}
}
