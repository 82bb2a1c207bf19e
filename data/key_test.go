package data

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// validKey is the processed bucket's key alphabet (nats.go's validKeyRe).
var validKey = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

var keyCases = []struct {
	name, id, want string
}{
	{name: "plain", id: "payroll-42", want: "payroll-42"},
	{name: "underscore", id: "a_b", want: "a_b"},
	{name: "seq id", id: "seq-7", want: "seq-7"},
	{name: "space", id: "a b", want: "=YSBi"},
	{name: "dot", id: "a.b", want: "=YS5i"},
	{name: "slash", id: "a/b", want: "=YS9i"},
	{name: "wildcards", id: "*>", want: "=Kj4"},
	{name: "unicode", id: "ü", want: "=w7w"},
	{name: "leading equals", id: "=x", want: "=PXg"},
}

func TestKey(t *testing.T) {
	for _, tt := range keyCases {
		t.Run(tt.name, func(t *testing.T) {
			got := Key(tt.id)
			if got != tt.want {
				t.Errorf("Key(%q): got %q, want %q", tt.id, got, tt.want)
			}
			back, err := IDFromKey(got)
			if err != nil || back != tt.id {
				t.Errorf("IDFromKey(%q): got %q, %v, want %q", got, back, err, tt.id)
			}
		})
	}
}

func TestKeyOfLongIDIsHashed(t *testing.T) {
	long := strings.Repeat("é", 600)
	k := Key(long)
	if !strings.HasPrefix(k, "==") || !validKey.MatchString(k) || len(k) > 64 {
		t.Errorf("Key(long): got %q, want a short == hash key", k)
	}
	if Key(long+"x") == k {
		t.Errorf("two long IDs share key %q", k)
	}
	if _, err := IDFromKey(k); !errors.Is(err, ErrBadKey) {
		t.Errorf("IDFromKey(hashed): got %v, want ErrBadKey", err)
	}
}

func FuzzKey(f *testing.F) {
	for _, tt := range keyCases {
		f.Add(tt.id)
	}
	f.Add(strings.Repeat("x", 1024))
	f.Fuzz(func(t *testing.T, id string) {
		if id == "" {
			return
		}
		k := Key(id)
		if !validKey.MatchString(k) || strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") {
			t.Fatalf("Key(%q) = %q: not a valid KV key", id, k)
		}
		if strings.HasPrefix(k, "==") {
			return
		}
		back, err := IDFromKey(k)
		if err != nil || back != id {
			t.Fatalf("IDFromKey(Key(%q)) = %q, %v", id, back, err)
		}
	})
}

func TestIsSeqID(t *testing.T) {
	for id, want := range map[string]bool{"seq-7": true, "seq-0": true, "seq-18446744073709551615": true, "seq-": false, "seq-7x": false, "seq--7": false, "Seq-7": false, "x-seq-7": false, "": false} {
		if got := IsSeqID(id); got != want {
			t.Errorf("IsSeqID(%q): got %v, want %v", id, got, want)
		}
	}
	if id := SeqID(42); !IsSeqID(id) {
		t.Errorf("IsSeqID(SeqID(42) = %q): got false", id)
	}
}
