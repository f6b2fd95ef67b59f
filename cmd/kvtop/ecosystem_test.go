package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

// The ecosystem's flags are off by default, and their mistakes are usage errors.
func TestEcosystemFlags(t *testing.T) {
	o, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.eco.kvEvents != "" {
		t.Errorf("parseServe() = %+v: want KV events off", o.eco)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kv-events", "127.0.0.1:1"}, "want tcp://HOST:PORT"},
		{[]string{"--kv-events", "tcp://0.0.0.0:5557"}, "not a loopback address"},
		{[]string{"--kv-events", "tcp://127.0.0.1:5557", "--kv-events-replay", "tcp://10.1.1.1:5558"}, "not a loopback address"},
		{[]string{"--kv-events", "tcp://127.0.0.1:5557", "--kv-events-encoding", "json"}, "unknown encoding"},
	} {
		_, err := parseServe(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseServe(%q) = %v, want an error saying %q", c.args, err, c.want)
		}
	}
	if _, err := parseServe([]string{"--kv-events", "tcp://0.0.0.0:5557", "--kv-events-remote"}, io.Discard); err != nil {
		t.Errorf("parseServe(--kv-events-remote) = %v, want it accepted", err)
	}
}

// serve --kv-events publishes the prefix cache's blocks, and kv-events prints them: from
// AllBlocksCleared on, every BlockStored a chain of full pages with its tokens, every
// BlockRemoved of blocks stored before.
func TestServePublishesKVEventsThatKVEventsPrints(t *testing.T) {
	o, err := parseServe([]string{"--listen", "127.0.0.1:0", "--drive", "chat", "--steps-per-sec", "200",
		"--kv-events", "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errb bytes.Buffer
	s, err := startServer(ctx, o, &errb)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := s.Wait(); err != nil {
			t.Error(err)
		}
	}()
	var desc bytes.Buffer
	s.eco.describe(&desc)
	if !strings.Contains(desc.String(), "kv events: tcp://127.0.0.1:") {
		t.Errorf("describe() = %q, want the KV events' address", desc.String())
	}
	subCtx, stop := context.WithTimeout(ctx, 3*time.Second)
	defer stop()
	var out, serr bytes.Buffer
	code := kvEventsCommand(subCtx, []string{"--replay", "tcp://" + s.eco.kv.ReplayAddr().String(), "--from-start",
		"tcp://" + s.eco.kv.Addr().String()}, &out, &serr)
	if code != 0 {
		t.Fatalf("kv-events = %d: %s", code, serr.String())
	}
	held := map[string]bool{}
	lines, stored := 0, 0
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var l struct {
			Seq         uint64        `json:"seq"`
			Type        string        `json:"type"`
			BlockHashes []json.Number `json:"block_hashes"`
			TokenIDs    []int64       `json:"token_ids"`
			BlockSize   int           `json:"block_size"`
			Medium      string        `json:"medium"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %d: %v: %s", lines, err, sc.Bytes())
		}
		if lines == 0 && (l.Type != "AllBlocksCleared" || l.Seq != 0) {
			t.Fatalf("the first line is %s, want AllBlocksCleared of batch 0", sc.Bytes())
		}
		lines++
		switch l.Type {
		case "BlockStored":
			if l.BlockSize != 16 || len(l.TokenIDs) != 16*len(l.BlockHashes) || l.Medium != "GPU" {
				t.Fatalf("line %d: %s: want blocks of 16 tokens, in GPU", lines, sc.Bytes())
			}
			for _, h := range l.BlockHashes {
				held[h.String()] = true
				stored++
			}
		case "BlockRemoved":
			for _, h := range l.BlockHashes {
				if !held[h.String()] {
					t.Fatalf("line %d: block %s removed, never stored", lines, h)
				}
				delete(held, h.String())
			}
		}
	}
	if stored < 20 {
		t.Errorf("%d lines, %d blocks stored in 3 seconds of chat: want more", lines, stored)
	}
}
