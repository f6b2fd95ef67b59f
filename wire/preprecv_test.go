package wire

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// prepRecvBodies are prep_recv bodies of every shape the fast reader must either read as
// encoding/json does or leave to it.
var prepRecvBodies = []string{
	`{"user":"A","prompt":[1,2,3],"end":-1,"max_tokens":4}`,
	`{"user": "A", "prompt": [1, 2, 3], "end": -1, "max_tokens": 4, "n": 1, "model": "m"}`,
	" \n{\t\"prompt\" :\r[ 0 , -0,2147483647,-2147483648 ] , \"user\":\"A\" }\n ",
	`{"PROMPT":[1],"User":"A","END":0,"Max_Tokens":2}`,
	`{"user":"A","prompt":[]}`,
	`{"user":"A","prompt":[1,2,3],"temperature":0.7,"stop":["\n","]"],"logit_bias":{"1":-100},"stream":false}`,
	`{"user":"A","prompt":[1,2,3],"extra":{"a":[1,{"b":"}"}]}}`,
	`{"user":"A\u00e9\n","prompt":[1]}`,
	`{"user":"A","prompt":[2147483648]}`,
	`{"user":"A","prompt":[-2147483649]}`,
	`{"user":"A","prompt":[99999999999999999999]}`,
	`{"user":"A","prompt":[1.0]}`,
	`{"user":"A","prompt":[1e3]}`,
	`{"user":"A","prompt":[01]}`,
	`{"user":"A","prompt":[-]}`,
	`{"user":"A","prompt":[1,]}`,
	`{"user":"A","prompt":[,1]}`,
	`{"user":"A","prompt":[1 2]}`,
	`{"user":"A","prompt":[1,null,2]}`,
	`{"user":"A","prompt":["1"]}`,
	`{"user":"A","prompt":"hello"}`,
	`{"user":"A","prompt":null}`,
	`{"user":"A","prompt":[1],"prompt":[2]}`,
	`{"user":"A","prompt":[1],"Prompt":[2]}`,
	`{"user":"A","user":"B","prompt":[1]}`,
	`{"user":"A","prompt":[1],"end":1.5}`,
	`{"user":"A","prompt":[1],"end":"1"}`,
	`{"user":"A","prompt":[1],"end":null,"max_tokens":null}`,
	`{"user":"A","prompt":[1],"max_tokens":0}`,
	`{"user":"A","prompt":[1],"n":1e400}`,
	`{"user":"A\u0000","prompt":[1]}`,
	`{"user":"A","prompt":[1]} x`,
	`{"user":"A","prompt":[1]}{}`,
	`{"user":"A","prompt":[1]`,
	`{"user":"A","prompt":[1`,
	`{"user":"A" "prompt":[1]}`,
	`{"us\u0065r":"A","prompt":[1]}`,
	`{"uſer":"A","prompt":[1]}`,
	`{"user":"A","prompt":[1],"x":tru}`,
	`{"user":"A","prompt":[1],"x":}`,
	`{"user":"A","prompt":[1],}`,
	`{}`,
	``,
	`[]`,
	`null`,
	"{\"user\":\"A\",\"prompt\":[1],\"x\":\"\xff\"}",
}

// checkFastPrepRecv fails t unless DecodePrepRecv answers b exactly as encoding/json alone
// does, and unless what the fast reader accepts is what encoding/json reads.
func checkFastPrepRecv(t *testing.T, b []byte) {
	t.Helper()
	got, gotErr := DecodePrepRecv(b, 100)
	want, wantErr := slowPrepRecv(b, 100)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || !reflect.DeepEqual(got, want) {
		t.Fatalf("DecodePrepRecv(%q) = %+v, %v; encoding/json: %+v, %v", b, got, gotErr, want, wantErr)
	}
	body, prompt, ok := fastPrepRecv(b)
	if !ok {
		return
	}
	var ref prepRecvBody
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatalf("fastPrepRecv(%q) accepts what encoding/json refuses: %v", b, err)
	}
	if len(ref.Prompt) == 0 {
		if prompt != nil {
			t.Fatalf("fastPrepRecv(%q) reads a prompt encoding/json does not see", b)
		}
	} else {
		var ids []int64
		if err := json.Unmarshal(ref.Prompt, &ids); err != nil {
			t.Fatalf("fastPrepRecv(%q) reads a prompt encoding/json does not: %v", b, err)
		}
		if len(ids) != len(prompt) || (ids == nil) != (prompt == nil) {
			t.Fatalf("fastPrepRecv(%q): %d tokens, encoding/json %d", b, len(prompt), len(ids))
		}
		for i := range ids {
			if int64(prompt[i]) != ids[i] {
				t.Fatalf("fastPrepRecv(%q): token %d is %d, encoding/json %d", b, i, prompt[i], ids[i])
			}
		}
	}
	ref.Prompt, body.Prompt = nil, nil
	if !reflect.DeepEqual(body, ref) {
		t.Fatalf("fastPrepRecv(%q) = %+v; encoding/json %+v", b, body, ref)
	}
}

// Every body, well formed or not, is answered as encoding/json answers it: the same call or
// the same error.
func TestFastPrepRecvAgreesWithEncodingJSON(t *testing.T) {
	fast := 0
	for _, b := range prepRecvBodies {
		checkFastPrepRecv(t, []byte(b))
		if _, _, ok := fastPrepRecv([]byte(b)); ok {
			fast++
		}
	}
	if fast < 6 {
		t.Errorf("the fast reader took %d of the usual bodies, want at least 6", fast)
	}
	// A real prompt: 12k token ids.
	b := promptBody(12_000, rand.New(rand.NewPCG(1, 1)))
	if _, _, ok := fastPrepRecv(b); !ok {
		t.Fatalf("the fast reader refused a 12k-token prompt")
	}
	checkFastPrepRecv(t, b)
}

// FuzzFastPrepRecv checks that DecodePrepRecv answers every body as encoding/json does.
func FuzzFastPrepRecv(f *testing.F) {
	for _, b := range prepRecvBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkFastPrepRecv(t, b) })
}

// promptBody is a prep_recv body with an n-token prompt of ids as a 128k-token vocabulary
// gives them.
func promptBody(n int, rng *rand.Rand) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"llama","user":"req-1","prompt":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, rng.IntN(128_256))
	}
	sb.WriteString(`],"end":-1,"max_tokens":64,"temperature":0}`)
	return []byte(sb.String())
}

// BenchmarkDecodePrepRecv is a prep_recv body with a 12k-token prompt decoded: the MB/s are
// of its JSON. json is the generic decoding (what DecodePrepRecv did before and does for
// what the fast reader leaves to it).
func BenchmarkDecodePrepRecv(b *testing.B) {
	body := promptBody(12_000, rand.New(rand.NewPCG(1, 1)))
	for _, tc := range []struct {
		name   string
		decode func([]byte, int) (any, error)
	}{
		{"fast", func(b []byte, m int) (any, error) { return DecodePrepRecv(b, m) }},
		{"json", func(b []byte, m int) (any, error) { return slowPrepRecv(b, m) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.decode(body, 100); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
