package wire_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire"
)

// soakRequests is how many requests the soak test sends.
const soakRequests = 400

// The soak: a fixed number of requests through the API, each with a fate drawn from a
// seeded mix (the three calls; an abort after prep_recv; KV written while start_generate
// races it; a client that times out waiting for admission, or mid-stream; a start_generate
// abandoned at once), while dashboards connect and disconnect and the engine pauses now
// and then. Afterwards every page is
// free or recycling (leaks reclaimed), the engine's invariants hold, the runner holds
// nothing for callers, the goroutines are back to what they were, and no call was
// answered with a 5xx.
func TestSoak(t *testing.T) {
	h := newHarness(t, setup{
		cfg: func(c *engine.Config) {
			c.MaxTotalSequenceLength = 65536
			c.MaxNumSequence = 32
			c.ReclaimAfter = 300 * time.Millisecond // leaks and abandoned prepared requests end
			c.PreparedAgeLimit = 200 * time.Millisecond
			c.KeepFinished = 32
		},
		runner: func(c *runner.Config) { c.MaxWaiting = 64 },
		opts:   func(o *wire.Options) { o.Limits.WriteTimeout = time.Second },
	})
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	client := &http.Client{Transport: tr}
	var statuses sync.Map // status → *atomic.Int64
	count := func(status int) {
		v, _ := statuses.LoadOrStore(status, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	call := func(ctx context.Context, path string, body []byte, hdr map[string]string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+path, bytes.NewReader(body))
		if path != "/v1/kv" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err == nil {
			count(resp.StatusCode)
		}
		return resp, err
	}
	done := func(resp *http.Response, err error) []byte {
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	// Warm up, so the baseline has the server's long-lived goroutines.
	h.flow(t, "warm", prompt(40, 99), 2)
	client.CloseIdleConnections()
	baseline := runtime.NumGoroutine()

	stop := make(chan struct{})
	var viewers sync.WaitGroup
	for v := range 2 { // dashboards that come and go, under the connection cap
		viewers.Add(1)
		go func() {
			defer viewers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(150 * time.Millisecond):
				}
				c, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{})
				if err != nil {
					t.Errorf("viewer %d: %v", v, err)
					return
				}
				for range 3 {
					<-c.C()
					c.Take()
				}
				if i%2 == 0 {
					c.Control(feed.Control{Op: feed.ControlSnapshot})
				}
				c.Close()
			}
		}()
	}

	viewers.Add(1)
	go func() { // pauses, so that some callers time out waiting for admission
		defer viewers.Done()
		for {
			select {
			case <-stop:
				h.r.Control(feed.Control{Op: feed.ControlResume})
				return
			case <-time.After(40 * time.Millisecond):
			}
			h.r.Control(feed.Control{Op: feed.ControlPause})
			time.Sleep(25 * time.Millisecond)
			h.r.Control(feed.Control{Op: feed.ControlResume})
		}
	}()

	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	fates := make([]int, 6)
	rng := rand.New(rand.NewPCG(11, 1))
	for i := range soakRequests {
		fate := rng.IntN(len(fates))
		fates[fate]++
		wait := time.Duration(1+rng.IntN(20)) * time.Millisecond
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			id := fmt.Sprint("s", i)
			p := prompt(40+i%60, int32(i%5))
			p[len(p)-1] = int32(90000 + i)
			maxTokens := 2 + i%12
			if fate == 4 {
				maxTokens = 1500 // more than a completion's channel holds: its queue fills
			}
			prep, _ := json.Marshal(map[string]any{"user": id, "prompt": p, "end": -1, "max_tokens": maxTokens})
			ctx := context.Background()
			if fate == 3 { // the client gives up waiting for admission
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, wait)
				defer cancel()
			}
			b := done(call(ctx, "/microserving/prep_recv", prep, nil))
			var ans wire.PrepRecvAnswer
			if json.Unmarshal(b, &ans) != nil || ans.KVAppendMetadata == "" {
				return // refused, or the client left
			}
			kv := func() {
				md := map[string]string{wire.HeaderKVMetadata: ans.KVAppendMetadata}
				done(call(context.Background(), "/v1/kv", nil, md))
			}
			sg, _ := json.Marshal(map[string]any{"user": id, "begin": -1, "stream": i%2 == 0})
			switch fate {
			case 1: // the client goes away after prep_recv: a leak, reclaimed later
				ab, _ := json.Marshal(map[string]string{"user": id})
				done(call(context.Background(), "/debug/abort", ab, nil))
			case 2: // the KV and start_generate race
				var race sync.WaitGroup
				race.Go(kv)
				readStream(done, call, context.Background(), sg)
				race.Wait()
			case 4: // the client gives up mid-completion
				kv()
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				readStream(done, call, ctx, sg)
			case 5: // start_generate abandoned at once
				kv()
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				readStream(done, call, ctx, sg)
			default:
				kv()
				readStream(done, call, context.Background(), sg)
			}
		}()
	}
	wg.Wait()
	close(stop)
	viewers.Wait()
	client.CloseIdleConnections()

	// Quiescence: every request has ended and every leak has been reclaimed.
	var snap engine.Snapshot
	waitFor(t, "every page to be free or recycling", func() bool {
		snap = h.snapshot()
		d := snap.Derived
		return d.Pages[engine.PageFree]+d.Pages[engine.PageRecycling] == snap.Pages.NumPages
	})
	h.engine(func(e *engine.Engine) {
		if err := e.Check(); err != nil {
			t.Errorf("engine invariants after the soak: %v", err)
		}
	})
	if w := h.waiters(); w != (runner.Waiters{}) {
		t.Errorf("the runner holds %+v after the soak, want nothing", w)
	}
	waitFor(t, "the goroutines to wind down", func() bool { return runtime.NumGoroutine() <= baseline+2 })
	statuses.Range(func(k, v any) bool {
		if k.(int) >= 500 {
			t.Errorf("%d calls answered %d", v.(*atomic.Int64).Load(), k)
		}
		return true
	})
	t.Logf("fates %v; totals: arrived %d, finished %d, aborted %d, hazards %v; statuses %s", fates, snap.Totals.Arrived, snap.Totals.Finished, snap.Totals.Aborted, snap.Totals.Hazards, statusCounts(&statuses))
	if m := metrics(t, h); m[`kvtop_hazards_total{kind="abort-leak"}`] == 0 || snap.Totals.Aborted == 0 || snap.Totals.Finished == 0 {
		t.Errorf("the mix did not exercise what it should: fates %v, totals %+v", fates, snap.Totals)
	}
}

// readStream makes a start_generate and reads its answer to the end, or until ctx ends.
func readStream(done func(*http.Response, error) []byte, call func(context.Context, string, []byte, map[string]string) (*http.Response, error), ctx context.Context, body []byte) {
	resp, err := call(ctx, "/microserving/start_generate", body, nil)
	if err != nil {
		return
	}
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		done(resp, nil)
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: [DONE]") {
			return
		}
	}
}

func statusCounts(m *sync.Map) string {
	var parts []string
	m.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%d×%d", v.(*atomic.Int64).Load(), k))
		return true
	})
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
