package shape_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/kvtop/kvtop/"

// rules is the shape of kvtop: each row's packages must not depend on any of banned (an
// import path; one ending in "/" bans the tree below it), test files aside.
var rules = []struct {
	name   string
	pkgs   []string
	banned []string
	why    string
}{
	{
		name: "the engine does no I/O and draws nothing",
		pkgs: []string{mod + "engine", mod + "engine/pages", mod + "engine/prefix", mod + "engine/prepare", mod + "engine/runner", mod + "engine/blocks"},
		banned: []string{"net", "net/", "os/exec", "github.com/gorilla/", "github.com/prometheus/", "charm.land/", "go.opentelemetry.io/",
			mod + "ui", mod + "wire", mod + "wire/", mod + "record", mod + "sim", mod + "tracing"},
		why: "the engine is a deterministic core (and its goroutine wrapper): the server, the dashboard and recordings are built on it, never the other way round",
	},
	{
		name:   "the paged KV cache is a leaf",
		pkgs:   []string{mod + "engine/pages"},
		banned: []string{mod + "engine", mod + "engine/prefix", mod + "engine/prepare", mod + "engine/runner"},
		why:    "pages knows nothing of sequences' tokens, requests or steps",
	},
	{
		name:   "the prefix cache knows tokens, not pages",
		pkgs:   []string{mod + "engine/prefix"},
		banned: []string{mod + "engine", mod + "engine/pages", mod + "engine/prepare", mod + "engine/runner"},
		why:    "when it evicts it says so through a callback, and the caller frees the KV",
	},
	{
		name:   "prepare-receive knows no steps",
		pkgs:   []string{mod + "engine/prepare"},
		banned: []string{mod + "engine", mod + "engine/runner"},
		why:    "the engine drives the action; the action is testable on its own",
	},
	{
		name:   "the engine core stays below the feed",
		pkgs:   []string{mod + "engine", mod + "engine/pages", mod + "engine/prefix", mod + "engine/prepare"},
		banned: []string{mod + "feed", mod + "wire/"},
		why:    "feed is what viewers receive; the deterministic core knows no viewer (engine/runner, its goroutine wrapper, delivers to them)",
	},
	{
		name:   "feed does no I/O",
		pkgs:   []string{mod + "feed"},
		banned: []string{"net", "net/", "os/exec", mod + "wire", mod + "wire/", mod + "ui", mod + "engine/runner"},
		why:    "every producer and viewer shares feed: it holds values and the mailbox, nothing that reaches out",
	},
	{
		name:   "the frame codec needs no server",
		pkgs:   []string{mod + "wire/protocol"},
		banned: []string{"net", "net/", "github.com/gorilla/", "github.com/prometheus/", mod + "wire", mod + "engine/runner"},
		why:    "recordings and tests read frames without the HTTP server",
	},
	{
		name:   "record reads frames, not the server",
		pkgs:   []string{mod + "record"},
		banned: []string{"net/http", "github.com/gorilla/", "github.com/prometheus/", mod + "wire"},
		why:    "a recording is written and played back through wire/protocol alone",
	},
	{
		name:   "request traces observe the engine, beside the server",
		pkgs:   []string{mod + "tracing"},
		banned: []string{mod + "wire", mod + "wire/", mod + "ui", mod + "kvevents", "github.com/prometheus/", "github.com/gorilla/"},
		why:    "the tracer is one of the runner's observers, as the KV-event publisher is; the command wires it to the server and to /metrics",
	},
	{
		name:   "the server knows no tracer",
		pkgs:   []string{mod + "wire"},
		banned: []string{mod + "tracing", "go.opentelemetry.io/"},
		why:    "prep_recv's headers reach a tracer through wire.Options.PrepRecvTrace, a function the command hands the server",
	},
	{
		name:   "the tap proxies and shadows; it draws nothing",
		pkgs:   []string{mod + "tap"},
		banned: []string{mod + "ui", "charm.land/", mod + "record", mod + "sim", mod + "kvevents"},
		why:    "kvtop tap forwards calls and feeds shadow engines served through wire; the dashboard attaches to it as to any server",
	},
	{
		name:   "the dashboard sees only its Source",
		pkgs:   []string{mod + "ui"},
		banned: []string{mod + "wire", mod + "wire/", mod + "engine/runner", "net", "net/http"},
		why:    "ui.Source is satisfied by the runner, the wire client and the player alike; the dashboard cannot tell them apart",
	},
	{
		name:   "the dashboard records through a function it is handed",
		pkgs:   []string{mod + "ui"},
		banned: []string{mod + "record"},
		why:    "record writes the stream's frames (wire/protocol); ui.Recorder is satisfied by record.Recorder, which the command opens for R",
	},
}

// The imports run one way: every rule of the table holds.
func TestImportsKeepTheirShape(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	var roots []string
	for _, r := range rules {
		roots = append(roots, r.pkgs...)
	}
	graph := imports(t, roots)
	for _, r := range rules {
		for _, pkg := range r.pkgs {
			if _, ok := graph[pkg]; !ok {
				t.Errorf("%s: %s is not a package of the module (a rule about nothing holds trivially)", r.name, pkg)
				continue
			}
			all := deps(graph, pkg)
			for _, b := range r.banned {
				// One report a ban: the first dependency it catches, with its chain.
				if i := slices.IndexFunc(all, func(dep string) bool { return banned(dep, b) }); i >= 0 {
					t.Errorf("%s: %s depends on %s (%s): %s", r.name, pkg, all[i], strings.Join(chain(graph, pkg, all[i]), " → "), r.why)
				}
			}
		}
	}
}

// banned reports whether dep is b, or below b when b ends in "/".
func banned(dep, b string) bool {
	return dep == b || strings.HasSuffix(b, "/") && strings.HasPrefix(dep, b)
}

// The matcher itself: a tree ban covers what is below, an exact one only itself.
func TestBanned(t *testing.T) {
	for _, c := range []struct {
		dep, ban string
		want     bool
	}{
		{"net", "net", true},
		{"net/http", "net", false},
		{"net/http", "net/", true},
		{"github.com/kvtop/kvtop/wire/protocol", mod + "wire", false},
		{"github.com/kvtop/kvtop/wire/protocol", mod + "wire/", true},
		{"github.com/kvtop/kvtop/wirefoo", mod + "wire/", false},
	} {
		if got := banned(c.dep, c.ban); got != c.want {
			t.Errorf("banned(%q, %q) = %v, want %v", c.dep, c.ban, got, c.want)
		}
	}
}

// imports returns the import graph of roots and everything below them, test files aside.
func imports(t *testing.T, roots []string) map[string][]string {
	t.Helper()
	args := append([]string{"list", "-deps", "-test=false", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}, roots...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	g := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		g[f[0]] = f[1:]
	}
	return g
}

// deps returns what pkg depends on, directly or not, in a stable order.
func deps(g map[string][]string, pkg string) []string {
	seen := map[string]bool{pkg: true}
	var out []string
	var walk func(string)
	walk = func(p string) {
		for _, d := range g[p] {
			if !seen[d] {
				seen[d] = true
				out = append(out, d)
				walk(d)
			}
		}
	}
	walk(pkg)
	return out
}

// chain returns the shortest chain of imports from pkg to dep.
func chain(g map[string][]string, pkg, dep string) []string {
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == dep {
			var path []string
			for ; p != ""; p = prev[p] {
				path = append(path, strings.TrimPrefix(p, mod))
			}
			slices.Reverse(path)
			return path
		}
		for _, d := range g[p] {
			if _, ok := prev[d]; !ok {
				prev[d] = p
				queue = append(queue, d)
			}
		}
	}
	return nil
}
