package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kvtop/kvtop/tap"
	"github.com/kvtop/kvtop/ui"
	"github.com/kvtop/kvtop/wire"
)

// tapFleet is a kvtop tap's instances, read over its API, for the dashboard's instance
// picker.
type tapFleet struct {
	base, token string
	client      *http.Client
}

// attachedTap returns the fleet of the server at target when it is a kvtop tap (its
// /healthz says so), and false for anything else (a kvtop serve, or no answer yet).
func attachedTap(ctx context.Context, target, token string) (*tapFleet, bool) {
	base := target
	switch {
	case strings.HasPrefix(base, "ws://"):
		base = "http://" + strings.TrimPrefix(base, "ws://")
	case strings.HasPrefix(base, "wss://"):
		base = "https://" + strings.TrimPrefix(base, "wss://")
	case !strings.Contains(base, "://"):
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return nil, false
	}
	f := &tapFleet{base: u.Scheme + "://" + u.Host, token: token, client: &http.Client{Timeout: 5 * time.Second}}
	var h struct {
		Tap bool `json:"tap"`
	}
	if err := f.get(ctx, "/healthz", &h); err != nil || !h.Tap {
		return nil, false
	}
	return f, true
}

func (f *tapFleet) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.base+path, nil)
	if err != nil {
		return err
	}
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Rows lists the tap's instances.
func (f *tapFleet) Rows(ctx context.Context) ([]ui.FleetRow, error) {
	var got struct {
		Instances []tap.Instance `json:"instances"`
	}
	if err := f.get(ctx, "/v1/instances", &got); err != nil {
		return nil, err
	}
	rows := make([]ui.FleetRow, 0, len(got.Instances))
	for _, in := range got.Instances {
		rows = append(rows, ui.FleetRow{
			Address: in.Address, Role: in.Role, Note: in.Note,
			Waiting: in.Requests["waiting"], Prepared: in.Requests["prepared"] + in.Requests["kv-complete"], Running: in.Requests["running"],
			Stuck: in.Stuck, Used: in.PagesUsed, Free: in.PagesFree, Oldest: time.Duration(in.OldestWaitingMs) * time.Millisecond,
			Head: in.Head, Why: in.Why, Divergences: in.Divergences, Standing: in.Standing,
		})
	}
	return rows, nil
}

// Open attaches to one instance's shadow.
func (f *tapFleet) Open(ctx context.Context, addr string) (ui.Source, error) {
	target := strings.Replace(f.base, "http", "ws", 1) + "/v1/stream?instance=" + url.QueryEscape(addr)
	return wire.Dial(ctx, target, wire.ClientOptions{Token: f.token})
}
