package data

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestReadAck(t *testing.T) {
	for _, tt := range []struct {
		name     string
		status   string
		data     string
		seq      uint64
		wrongSeq bool
		wantErr  error
	}{
		{name: "stored", data: `{"stream":"KV_processed","seq":42}`, seq: 42},
		{name: "with domain", data: `{"stream":"KV_processed","domain":"hub","seq":7}`, seq: 7},
		{name: "duplicate", data: `{"stream":"KV_processed","seq":9,"duplicate":true}`, seq: 9},
		{name: "wrong last sequence", data: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"KV_processed","seq":0}`, wrongSeq: true},
		{name: "no responders", status: "503", wantErr: nats.ErrNoResponders},
		{name: "other status", status: "408"},
		{name: "garbage", data: `not json`},
		{name: "no sequence", data: `{"stream":"KV_processed"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &nats.Msg{Data: []byte(tt.data), Header: nats.Header{}}
			if tt.status != "" {
				m.Header.Set("Status", tt.status)
			}
			seq, err := readAck(m)
			switch {
			case tt.seq != 0:
				if err != nil || seq != tt.seq {
					t.Errorf("got %d, %v; want %d", seq, err, tt.seq)
				}
			case tt.wrongSeq:
				if !isWrongLastSeq(err) {
					t.Errorf("got %d, %v; want a wrong last sequence error", seq, err)
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("got %v, want %v", err, tt.wantErr)
				}
			default:
				if err == nil || isWrongLastSeq(err) {
					t.Errorf("got %d, %v; want a plain error", seq, err)
				}
			}
		})
	}
}

func TestWrongLastSeqOfAnyBucket(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, true},
		{fmt.Errorf("claim: %w", &jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}), true}, // a replicated bucket
		{&jetstream.APIError{ErrorCode: 10077}, false},
		{errWriteTimeout, false},
	} {
		if got := isWrongLastSeq(tt.err); got != tt.want {
			t.Errorf("isWrongLastSeq(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
