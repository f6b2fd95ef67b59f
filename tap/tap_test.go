package tap

import (
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/sim"
)

// scenarioConfig is the engine configuration a scenario runs with.
func scenarioConfig(t *testing.T, name string) engine.Config {
	t.Helper()
	sc, err := sim.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	c := engine.DefaultConfig()
	c.MaxTotalSequenceLength = 16384
	if sc.Configure != nil {
		sc.Configure(&c)
	}
	return c
}

// The sim's router drives two decode instances and a prefill instance through the tap:
// after every call, the tap's shadow of each D holds exactly D's state (requests, queues,
// pages, prefix tree), and no answer was mispredicted.
func TestShadowsEqualTheirDecodeInstances(t *testing.T) {
	for _, sc := range []string{"chat", "leak"} {
		t.Run(sc, func(t *testing.T) {
			cfg := scenarioConfig(t, sc)
			tp := newTopology(t, []engine.Config{cfg, cfg}, Config{Engine: cfg})
			d := tp.drive(sc, 7, 150, 2*time.Minute)
			st := d.Stats()
			if st.Finished < 5 || st.CallErrors > 0 {
				t.Fatalf("driver stats %+v (last error %v): the scenario did not run", st, d.LastError())
			}
			t.Logf("%s: %d calls through the tap, driver %+v", sc, tp.calls, st)
			for _, in := range tp.tap.Instances(t.Context()) {
				if in.Role == RoleDecode && (in.Divergences != 0 || in.Dropped != 0) {
					t.Errorf("instance %+v", in)
				}
			}
		})
	}
}
