package tap

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prefix"
)

// divergences reads the divergences a shadow's snapshot holds in its standing, and the
// events of the tap's stream are not needed: the standing counts them and keeps the last.
func (tp *topology) standing(addr string) engine.Standing {
	tp.t.Helper()
	s := tp.shadowSnapshot(addr)
	if s.Follow == nil {
		return engine.Standing{}
	}
	return *s.Follow
}

// livePagesAgree checks that every request D holds alive has the same pages in the shadow.
func livePagesAgree(d, s engine.Snapshot) []string {
	dp, sp := engine.RequestPages(d), engine.RequestPages(s)
	var out []string
	for _, r := range d.Requests {
		switch r.State {
		case engine.StatePrepared, engine.StateKVComplete, engine.StateRunning:
			if !slices.Equal(dp[r.ID], sp[r.ID]) {
				out = append(out, fmt.Sprintf("%s (%s): D's pages %v, the shadow's %v", r.ID, r.State, dp[r.ID], sp[r.ID]))
			}
		}
	}
	return out
}

// A tap given the wrong configuration for its decode instances reports divergences with the
// cause it can tell, and after each resync the pages of the request D admitted are D's.
func TestWrongConfigurationsDiverge(t *testing.T) {
	for _, c := range []struct {
		name   string
		wrong  func(*engine.Config)
		what   []engine.DivergenceKind
		cause  string
		agrees bool // the whole page map agrees again after the resync
	}{
		{"fewer pages", func(c *engine.Config) { c.MaxTotalSequenceLength = 10240 }, []engine.DivergenceKind{engine.DivergedBlocked}, "configuration is larger", true},
		{"a higher watermark", func(c *engine.Config) { c.Watermark = 700 }, []engine.DivergenceKind{engine.DivergedBlocked}, "watermark", true},
		{"lru eviction", func(c *engine.Config) { c.EvictOrder = prefix.EvictLRU }, []engine.DivergenceKind{engine.DivergedMetadata, engine.DivergedMatched}, "eviction order", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := scenarioConfig(t, "chat")
			wrong := cfg
			c.wrong(&wrong)
			tp := newTopology(t, []engine.Config{cfg}, Config{Engine: wrong})
			addr := tp.ds[0].addr()
			seen := uint64(0)
			var found []engine.Divergence
			tp.check = func(after string) {
				tp.flush()
				st := tp.standing(addr)
				if st.Divergences == seen || st.Last == nil {
					return
				}
				seen = st.Divergences
				found = append(found, *st.Last)
				d, s := tp.ds[0].snapshot(t), tp.shadowSnapshot(addr)
				if st.Last.What == engine.DivergedBlocked || st.Last.What == engine.DivergedMetadata {
					// The resync: the slots D reserved for the request are the shadow's.
					dr, sr := requestOf(d, st.Last.ID), requestOf(s, st.Last.ID)
					if dr.Encoded != sr.Encoded || fmt.Sprint(dr.Runs) != fmt.Sprint(sr.Runs) {
						t.Errorf("after %s, resynced: %s's slots: D %v (%s), the shadow %v (%s)", after, st.Last.ID, dr.Runs, dr.Encoded, sr.Runs, sr.Encoded)
					}
				}
				// The first divergence comes before any of its consequences (a smaller
				// cache evicts what D keeps): the page map agrees whole after its resync.
				if c.agrees && len(found) == 1 {
					if diff := engine.PageMapDiff(d, s); diff != nil {
						t.Errorf("after %s, the page map disagrees:\n%s", after, strings.Join(diff, "\n"))
					}
				}
			}
			tp.drive("chat", 7, 150, 3*time.Minute)
			if len(found) == 0 {
				t.Fatal("no divergence")
			}
			ok := false
			for _, d := range found {
				if slices.Contains(c.what, d.What) && strings.Contains(d.Cause, c.cause) {
					ok = true
				}
			}
			if !ok {
				t.Errorf("divergences %v, want one of %v naming %q", found, c.what, c.cause)
			}
			var inst Instance
			for _, in := range tp.tap.Instances(t.Context()) {
				if in.Address == addr {
					inst = in
				}
			}
			if inst.Divergences == 0 || !strings.Contains(inst.Standing, "diverged") {
				t.Errorf("instance %+v: want its divergences counted and its standing saying so", inst)
			}
			t.Logf("%d divergences, standing %q", inst.Divergences, inst.Standing)
		})
	}
}

func requestOf(s engine.Snapshot, id string) engine.RequestView {
	for _, r := range s.Requests {
		if r.ID == id {
			return r
		}
	}
	return engine.RequestView{}
}
