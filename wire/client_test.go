package wire_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire"
	"github.com/kvtop/kvtop/wire/protocol"
)

// The client's messages match their golden JSON (testdata/frames/client_*.json; the
// protocol's own frames are wire/protocol's golden files).
func TestClientMessagesGolden(t *testing.T) {
	got := make(chan []byte, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		var buf bytes.Buffer
		protocol.EncodeFrame(&buf, &protocol.Frame{Type: protocol.FrameHello, Hello: &protocol.Hello{Protocol: protocol.Version, Control: true, Config: testConfig()}})
		conn.WriteMessage(websocket.TextMessage, buf.Bytes())
		for {
			_, b, err := conn.ReadMessage()
			if err != nil {
				return
			}
			got <- b
		}
	}))
	defer srv.Close()
	c, err := wire.Dial(context.Background(), srv.URL, wire.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, ctl := range []feed.Control{{Op: feed.ControlSnapshot}, {Op: feed.ControlPause}, {Op: feed.ControlResume}, {Op: feed.ControlStep, N: 3}} {
		if err := c.Control(ctl); err != nil {
			t.Fatalf("Control(%+v) = %v", ctl, err)
		}
		path := filepath.Join("testdata", "frames", "client_"+string(ctl.Op)+".json")
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if b := <-got; !bytes.Equal(bytes.TrimRight(b, "\n"), bytes.TrimRight(want, "\n")) {
			t.Errorf("Control(%+v) sent %s, want %s (%s)", ctl, b, want, path)
		}
	}
}
