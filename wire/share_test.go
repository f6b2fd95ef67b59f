package wire

import (
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// A snapshot handed to many stream clients is encoded once.
func TestSnapshotIsEncodedOnce(t *testing.T) {
	sn := &hubSnapshot{snap: &engine.Snapshot{}}
	a, err := sn.encoded()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := sn.encoded(); again != a {
		t.Errorf("encoded() twice gave two encodings")
	}
}

// The connection limiter lets rate attempts through a second, as many at once, and no more.
func TestLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	l := newLimiter(3, func() time.Time { return now })
	for i := range 3 {
		if !l.allow() {
			t.Fatalf("attempt %d of a burst of 3 refused", i+1)
		}
	}
	if l.allow() {
		t.Errorf("a fourth attempt in the same instant allowed")
	}
	now = now.Add(time.Second/3 + time.Millisecond)
	if !l.allow() || l.allow() {
		t.Errorf("a third of a second later: want exactly one more attempt")
	}
	now = now.Add(time.Hour)
	for i := range 3 {
		if !l.allow() {
			t.Fatalf("after an hour, attempt %d refused: the burst refills to 3", i+1)
		}
	}
	if l.allow() {
		t.Errorf("after an hour, a fourth attempt allowed: the burst is 3, not more")
	}
}
