package server

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestSubjectMatchesAreNotCachedServerWide: jobq's subjects are nearly all
// new (record keys, ack subjects, reply subjects), so the server keeps no
// shared cache of matches, whose inserts would take its write lock on
// every publish.
func TestSubjectMatchesAreNotCachedServerWide(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Config{StoreDir: t.TempDir(), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("key.*")
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		if err := nc.Publish("key."+strconv.Itoa(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	sz, err := s.ns.Subsz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if sz.NumMatches < n {
		t.Fatalf("the server matched %d subjects, want %d or more", sz.NumMatches, n)
	}
	if sz.NumCache != 0 {
		t.Errorf("the server cached %d subject matches, want none", sz.NumCache)
	}
}
