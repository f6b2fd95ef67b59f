package tap

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvtop/kvtop/engine"
)

// Clients at once through the tap, as a router serving many users sends their calls: each
// of several goroutines runs requests (prep_recv, P's remote_send, start_generate streamed
// to its end), half of them sharing a prefix. D takes racing calls in an order of its own,
// the shadow in the order the tap forwarded them, so the shadow diverges (the order, the
// pages, a prefix D matched before the shadow saw it) and says so in its standing. What
// holds: every request is the shadow's too and ends as on D, and the pages of unknown use
// stay fewer than the requests could hold (one resync's sunk pages once made nearly every
// free page unknown).
func TestConcurrentClientsThroughTheTap(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxTotalSequenceLength = 65536
	tp := newTopology(t, []engine.Config{cfg}, Config{Engine: cfg})
	d := tp.ds[0]
	post := func(base, path string, body any) ([]byte, int, error) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := tp.client.Do(req)
		if err != nil {
			return nil, 0, err
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		return out, resp.StatusCode, err
	}
	run := func(id string, p []int32) error {
		b, code, err := post(d.srv.URL, "/microserving/prep_recv", map[string]any{"user": id, "prompt": p, "end": -1, "max_tokens": 8})
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("prep_recv %s: %d %s %v", id, code, b, err)
		}
		var ans engine.Answer
		if err := json.Unmarshal(b, &ans); err != nil {
			return err
		}
		end := len(p) - 1
		if end > ans.Matched {
			if b, code, err := post(tp.p.srv.URL, "/microserving/remote_send", map[string]any{
				"user": id, "begin": ans.Matched, "end": end, "kv_addr_info": ans.Metadata, "recv_rank": 0}); err != nil || code != http.StatusOK {
				return fmt.Errorf("remote_send %s: %d %s %v", id, code, b, err)
			}
		}
		b, code, err = post(d.srv.URL, "/microserving/start_generate", map[string]any{"user": id, "begin": end, "stream": true})
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("start_generate %s: %d %s %v", id, code, b, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"finish_reason":"length"`) {
				return nil
			}
		}
		return fmt.Errorf("start_generate %s: no finish_reason length in %q", id, b)
	}
	const clients, each = 6, 5
	var wg sync.WaitGroup
	errs := make(chan error, clients*each)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				// Half the prompts share a 64-token prefix with another client's.
				p := prompt(1000*c+k, 120)
				if k%2 == 0 {
					copy(p, prompt(7, 64))
				}
				if err := run(fmt.Sprintf("c%d-%d", c, k), p); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	tp.flush()
	want, got := d.snapshot(t), tp.shadowSnapshot(d.addr())
	st := got.Follow
	t.Logf("%d requests from %d clients at once; the shadow's standing: %s", clients*each, clients, st.Describe(int64(got.Stamp.Step)))
	ends := map[string]engine.RequestState{}
	for _, r := range got.Requests {
		ends[r.ID] = r.State
	}
	for _, r := range want.Requests {
		if s, ok := ends[r.ID]; !ok || s != r.State {
			t.Errorf("%s: %s on D, %s in the shadow (held %v)", r.ID, r.State, s, ok)
		}
	}
	if len(got.Requests) != len(want.Requests) {
		t.Errorf("the shadow has %d requests, D %d", len(got.Requests), len(want.Requests))
	}
	pagesEach := (120 + cfg.PageSize - 1) / cfg.PageSize
	if st.UnknownPages > clients*each*pagesEach {
		t.Errorf("%d pages of unknown use, more than the %d requests could hold (%d pages each)", st.UnknownPages, clients*each, pagesEach)
	}
}
