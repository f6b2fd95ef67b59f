package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"slices"
	"testing"
)

// Every struct type of event.go that embeds Stamp is an event (the set is closed: they are the
// types of that file), and every event is in the registry exactly once, under a name of its
// own: a new event type cannot be forgotten by the decoders, the list of kinds or the
// timelines.
func TestRegistryHoldsEveryEventType(t *testing.T) {
	var declared []string
	f, err := parser.ParseFile(token.NewFileSet(), "event.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return true
		}
		for _, fl := range st.Fields.List {
			if id, ok := fl.Type.(*ast.Ident); ok && len(fl.Names) == 0 && id.Name == "Stamp" {
				declared = append(declared, ts.Name.Name)
			}
		}
		return true
	})
	var registered, names []string
	for _, k := range registry {
		registered = append(registered, k.typ.Name())
		names = append(names, k.name)
	}
	slices.Sort(declared)
	slices.Sort(registered)
	if !slices.Equal(declared, registered) {
		t.Errorf("event types declared %v, registered %v", declared, registered)
	}
	if slices.Sort(names); len(slices.Compact(names)) != len(registry) {
		t.Errorf("registry names are not unique: %v", EventKinds())
	}
}

// A decoder's round trip: NewEvent makes a pointer of the kind, KindOf names the pointer and
// the value alike, and Deref gives back the value type.
func TestNewEventDerefAndKindOfAgree(t *testing.T) {
	for _, name := range EventKinds() {
		p, ok := NewEvent(name)
		if !ok {
			t.Fatalf("NewEvent(%q) = false", name)
		}
		if reflect.TypeOf(p).Kind() != reflect.Pointer {
			t.Errorf("NewEvent(%q) = %T, want a pointer", name, p)
		}
		v := Deref(p)
		if reflect.TypeOf(v).Kind() == reflect.Pointer {
			t.Errorf("Deref(%T) = %T, want the value", p, v)
		}
		if KindOf(p) != name || KindOf(v) != name {
			t.Errorf("KindOf(%T), KindOf(%T) = %q, %q, want %q", p, v, KindOf(p), KindOf(v), name)
		}
	}
	if _, ok := NewEvent("no_such_kind"); ok {
		t.Errorf("NewEvent of an unknown kind succeeded")
	}
}

// The registry decides which events concern a request and how they show on its timeline.
func TestRequestOfAndTimelinesFollowTheRegistry(t *testing.T) {
	for _, tc := range []struct {
		ev       Event
		id       string
		onLine   bool
		coalesce bool
	}{
		{RequestArrived{ID: "a"}, "a", true, false},
		{PrepareBlocked{ID: "a"}, "a", true, true},
		{KVReceived{ID: "a"}, "a", true, true},
		{HazardDetected{Hazard: Hazard{ID: "h"}}, "h", true, false},
		{SeqForked{ID: "a"}, "a", false, false},
		{Decoded{IDs: []string{"a"}}, "", false, false},
		{StepCompleted{}, "", false, false},
	} {
		id, _ := RequestOf(tc.ev)
		mid, coalesce, on := markOf(tc.ev)
		if id != tc.id || on != tc.onLine || coalesce != tc.coalesce || (on && mid != tc.id) {
			t.Errorf("%s: RequestOf %q, markOf %q %v %v; want %q, on timeline %v, coalesced %v",
				KindOf(tc.ev), id, mid, coalesce, on, tc.id, tc.onLine, tc.coalesce)
		}
	}
}
