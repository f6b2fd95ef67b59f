package wire

import (
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// A snapshot handed to many stream clients is encoded once.
func TestSnapshotIsEncodedOnce(t *testing.T) {
	s := &Server{}
	a, b := &engine.Snapshot{}, &engine.Snapshot{}
	ea, err := s.encoded(a)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := s.encoded(a); again != ea {
		t.Errorf("encoded(a) twice gave two encodings")
	}
	if eb, _ := s.encoded(b); eb == ea {
		t.Errorf("encoded(b) reused a's encoding")
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
