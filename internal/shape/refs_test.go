package shape_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The repository stands on its own: no file refers to the shared folder beside a checkout
// (a clone does not have it), and no file outside the tests cites sections of a spec that is
// not in the repository; the docs/ pages say what kvtop does, and files point at them.
func TestNoReferencesOutsideTheRepository(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git command")
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	top := strings.TrimSpace(string(root))
	out, err := exec.Command("git", "-C", top, "ls-files", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatal(err)
	}
	// Spelled in two parts so that this file does not match itself.
	outside := regexp.MustCompile(`\.\./` + `shared\b`)
	spec := regexp.MustCompile(`(?i)\bspec(?:\s+section)?\s+\d+(?:\.\d+)?|\bsection\s+\d+(?:\.\d+)?\b|\bthe spec\b`)
	files := 0
	for _, name := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		b, err := os.ReadFile(filepath.Join(top, name))
		if err != nil || strings.IndexByte(string(b[:min(len(b), 8000)]), 0) >= 0 {
			continue // deleted in the working tree, or binary
		}
		files++
		test := strings.HasSuffix(name, "_test.go") || strings.Contains("/"+name, "/testdata/")
		for i, line := range strings.Split(string(b), "\n") {
			if outside.MatchString(line) {
				t.Errorf("%s:%d refers outside the repository: %s", name, i+1, strings.TrimSpace(line))
			}
			if !test && spec.MatchString(line) {
				t.Errorf("%s:%d cites a spec the repository does not hold (point at docs/ instead): %s", name, i+1, strings.TrimSpace(line))
			}
		}
	}
	if files < 50 {
		t.Fatalf("read %d files: the walk missed the repository", files)
	}
}

// The patterns catch what they are for and leave kvtop's own words alone.
func TestReferencePatterns(t *testing.T) {
	spec := regexp.MustCompile(`(?i)\bspec(?:\s+section)?\s+\d+(?:\.\d+)?|\bsection\s+\d+(?:\.\d+)?\b|\bthe spec\b`)
	for line, want := range map[string]bool{
		"the admission predicates of spec 5.2":       true,
		"(spec section 2, MLC names)":                true,
		"named in the spec (section 11)":             true,
		"--spec-draft-len 3":                         false,
		"spec_draft_length + 1":                      false,
		"see docs/admission.md":                      false,
		"the speculative decoding's spec factor":     false,
		"the watermark stall (docs/admission.md) 8 ": false,
	} {
		if got := spec.MatchString(line); got != want {
			t.Errorf("%q: matched %v, want %v", line, got, want)
		}
	}
}
