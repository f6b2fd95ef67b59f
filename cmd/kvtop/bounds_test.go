package main

import (
	"bytes"
	"flag"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// command is one of kvtop's commands as the flag tests see it: its flags, their bounds, and
// how it parses and runs.
type command struct {
	name   string
	flags  func() *flag.FlagSet
	bounds []map[string]bound
	// parse parses the flags as the command does before it starts anything.
	parse func(args []string) error
	// args wraps the flags into a command line for run.
	args func(flags ...string) []string
}

func commands() []command {
	return []command{
		{
			name:   "kvtop",
			flags:  func() *flag.FlagSet { fs, _ := dashboardFlags(io.Discard); return fs },
			bounds: []map[string]bound{engineBounds, dashboardBounds},
			parse:  func(a []string) error { _, err := parseDashboard(a, io.Discard); return err },
			args:   func(f ...string) []string { return f },
		},
		{
			name:   "kvtop serve",
			flags:  func() *flag.FlagSet { fs, _ := serveFlags(io.Discard); return fs },
			bounds: []map[string]bound{engineBounds, serveBounds},
			parse:  func(a []string) error { _, err := parseServe(a, io.Discard); return err },
			args:   func(f ...string) []string { return append([]string{"serve"}, f...) },
		},
		{
			name:   "kvtop replay",
			flags:  func() *flag.FlagSet { fs, _ := replayFlags(io.Discard); return fs },
			bounds: []map[string]bound{replayBounds},
			parse:  func(a []string) error { _, err := parseReplay(append(a, "rec.jsonl"), io.Discard); return err },
			args:   func(f ...string) []string { return append(append([]string{"replay"}, f...), "rec.jsonl") },
		},
	}
}

// numeric returns the kind of a numeric flag ("int", "uint", "float", "duration"), or "".
func numeric(f *flag.Flag) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case int, int64:
		return "int"
	case uint, uint64:
		return "uint"
	case float64:
		return "float"
	case time.Duration:
		return "duration"
	}
	return ""
}

func (c command) bound(name string) (bound, bool) {
	for _, b := range c.bounds {
		if bd, ok := b[name]; ok {
			return bd, true
		}
	}
	return bound{}, false
}

// Every numeric flag of every command has a bound: a flag added without one fails here.
func TestEveryNumericFlagIsBounded(t *testing.T) {
	for _, c := range commands() {
		n := 0
		c.flags().VisitAll(func(f *flag.Flag) {
			if numeric(f) == "" {
				return
			}
			n++
			if _, ok := c.bound(f.Name); !ok {
				t.Errorf("%s --%s (%s) has no bound", c.name, f.Name, numeric(f))
			}
		})
		if n == 0 {
			t.Errorf("%s has no numeric flags: the test does not see them", c.name)
		}
	}
}

// edge is one value a numeric flag is tried at, and whether it is in its range.
type edge struct {
	value string
	ok    bool
}

// edges are the values a flag is tried at: 0, -1, its maximum, one past it, MaxInt64, and
// NaN and infinity for a float. Whether each is in range follows from the bound, computed
// here independently of bound.check.
func edges(kind string, b bound) []edge {
	in := func(v int64) bool { return b.any || v >= b.ilo && v <= b.ihi }
	switch kind {
	case "int":
		out := []edge{{"0", in(0)}, {"-1", in(-1)}, {strconv.FormatInt(b.ihi, 10), true},
			{strconv.FormatInt(math.MaxInt64, 10), in(math.MaxInt64)}}
		if b.ihi < math.MaxInt64 {
			out = append(out, edge{strconv.FormatInt(b.ihi+1, 10), false})
		} else {
			out = append(out, edge{"9223372036854775808", false}) // does not parse
		}
		return out
	case "uint":
		return []edge{{"0", true}, {"-1", false}, {"18446744073709551615", true}, {"18446744073709551616", false},
			{strconv.FormatInt(math.MaxInt64, 10), true}}
	case "duration":
		d := func(v int64) string { return time.Duration(v).String() }
		out := []edge{{"0s", in(0)}, {"-1s", in(-int64(time.Second))}, {d(b.ihi), true},
			{strconv.FormatInt(math.MaxInt64, 10) + "ns", in(math.MaxInt64)}}
		if b.ihi < math.MaxInt64 {
			out = append(out, edge{d(b.ihi + 1), false})
		}
		return out
	case "float":
		fin := func(v float64) bool {
			return v == 0 && b.zeroOK || v <= b.hi && (v > b.lo || v == b.lo && !b.loOpen)
		}
		return []edge{{"0", fin(0)}, {"-1", fin(-1)}, {strconv.FormatFloat(b.hi, 'g', -1, 64), true},
			{strconv.FormatFloat(b.hi+1, 'g', -1, 64), false}, {strconv.FormatInt(math.MaxInt64, 10), fin(math.MaxInt64)},
			{"NaN", false}, {"Inf", false}, {"-Inf", false}}
	}
	panic(kind)
}

// Every numeric flag of every command, at its edges: a value in range is taken, one out of
// range (or NaN, or an infinity) is refused before anything starts, with status 2 and a
// message naming the flag. Nothing panics.
func TestNumericFlagsAtTheirEdges(t *testing.T) {
	t.Setenv("KVTOP_TOKEN", "")
	for _, c := range commands() {
		c.flags().VisitAll(func(f *flag.Flag) {
			kind := numeric(f)
			b, ok := c.bound(f.Name)
			if kind == "" || !ok {
				return
			}
			for _, e := range edges(kind, b) {
				flags := []string{"--" + f.Name, e.value}
				if e.ok {
					if err := c.parse(flags); err != nil {
						t.Errorf("%s --%s %s: %v, want it accepted", c.name, f.Name, e.value, err)
					}
					continue
				}
				// Parse first: a value that got through must not start the command.
				if err := c.parse(flags); err == nil {
					t.Errorf("%s --%s %s: accepted, want it refused", c.name, f.Name, e.value)
					continue
				}
				var out, errb bytes.Buffer
				code := run(c.args(flags...), &out, &errb)
				if code != 2 || !strings.Contains(errb.String(), "-"+f.Name) {
					t.Errorf("%s --%s %s = %d, %q; want 2 and a message naming -%s", c.name, f.Name, e.value, code, firstLine(errb.String()), f.Name)
				}
			}
		})
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// The reproductions of issue 11: sizes that used to wrap around, panic at start or make
// every start_generate panic are usage errors now.
func TestOverflowingSizesAreUsageErrors(t *testing.T) {
	t.Setenv("KVTOP_TOKEN", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--arena", "32x1x144115188075855873"}, "more than any host holds"},
		{[]string{"serve", "--arena", "1000000x1000000x1000000"}, "more than any host holds"},
		{[]string{"serve", "--arena", "4294967296x4294967296x2"}, "more than any host holds"},
		{[]string{"--arena", "4294967296x4294967296x2"}, "more than any host holds"},
		{[]string{"serve", "--max-tokens", "9223372036854775807"}, "--max-tokens 9223372036854775807 must be in [1, 1048576]"},
		{[]string{"serve", "--trace-requests", "9223372036854775807"}, "--trace-requests 9223372036854775807 must be in"},
		{[]string{"serve", "--steps-per-sec", "NaN"}, "--steps-per-sec NaN must be 0 or a number in"},
		{[]string{"--steps-per-sec", "+Inf"}, "--steps-per-sec +Inf must be"},
		{[]string{"serve", "--max-total-seq-len", "9223372036854775807"}, "--max-total-seq-len"},
		{[]string{"replay", "--speed", "NaN", "x.jsonl"}, "--speed NaN must be a number in (0, 1000]"},
		{[]string{"replay", "--step", "-2", "x.jsonl"}, "--step -2 must be in [-1,"},
	} {
		if err := parseCommand(tc.args); err == nil {
			t.Errorf("kvtop %s: accepted, want it refused", strings.Join(tc.args, " "))
			continue
		}
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("kvtop %s = %d, %q; want 2 and %q", strings.Join(tc.args, " "), code, firstLine(errb.String()), tc.want)
		}
	}
}

// parseCommand parses a command line as run would, without starting anything.
func parseCommand(args []string) error {
	for _, c := range commands()[1:] {
		if name := strings.TrimPrefix(c.name, "kvtop "); args[0] == name {
			if name == "replay" {
				_, err := parseReplay(args[1:], io.Discard)
				return err
			}
			return c.parse(args[1:])
		}
	}
	return commands()[0].parse(args)
}

// The bound check names the flag, its value and the range it wants.
func TestBoundMessages(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Float64("rate", 0, "")
	fs.Int("n", 0, "")
	fs.Duration("d", 0, "")
	if err := fs.Parse([]string{"--rate", "NaN", "--n", "7", "--d", "2h"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    bound
		want string
	}{
		{"rate", bound{lo: 1, hi: 10, zeroOK: true}, "--rate NaN must be 0 or a number in [1, 10]"},
		{"n", ints(0, 5), "--n 7 must be in [0, 5]"},
		{"d", durations(0, time.Hour), "--d 2h0m0s must be in [0s, 1h0m0s]"},
	} {
		if err := checkBounds(fs, map[string]bound{tc.name: tc.b}); err == nil || err.Error() != tc.want {
			t.Errorf("checkBounds(--%s) = %v, want %q", tc.name, err, tc.want)
		}
	}
}
