package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/sim"
)

// The simulated router keeps a bounded number of prep_recv calls waiting for admission: one
// more is refused at once instead of costing another goroutine and connection.
func TestDriverBoundsItsPrepRecvCalls(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, maxDrivePrepRecv+1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, `{"error":{"message":"released","type":"test"}}`, http.StatusServiceUnavailable)
	}))
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	h := &httpDrive{base: ts.URL, client: ts.Client(), ctx: ctx, obs: make(chan func(*sim.Driver, sim.Calls), 2*maxDrivePrepRecv),
		preps: make(chan struct{}, maxDrivePrepRecv)}
	call := func(i int) error {
		return h.PrepRecv(engine.PrepRecv{ID: fmt.Sprint("r", i), Prompt: []int32{1, 2, 3}, End: -1, HasEnd: true})
	}
	for i := range maxDrivePrepRecv {
		if err := call(i); err != nil {
			t.Fatalf("prep_recv %d of %d: %v", i, maxDrivePrepRecv, err)
		}
	}
	for range maxDrivePrepRecv {
		<-arrived
	}
	if err := call(maxDrivePrepRecv); !errors.Is(err, errDriveBusy) {
		t.Errorf("prep_recv %d with %d in flight = %v, want errDriveBusy", maxDrivePrepRecv+1, maxDrivePrepRecv, err)
	}
	close(release)
	h.wg.Wait()
	if err := call(0); err != nil {
		t.Errorf("prep_recv once the others were answered = %v, want it sent", err)
	}
	cancel()
	h.wg.Wait()
}
