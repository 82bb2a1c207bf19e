package queue

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A look-up whose wait ran out without an answer is tried again while its
// ctx lasts; any other outcome stands, and without a deadline there is
// one try.
func TestRetryUnansweredTriesAgainOnlyWhatWentUnanswered(t *testing.T) {
	t.Parallel()
	unansweredOnce := func(tries *int) func(context.Context) (string, error) {
		return func(context.Context) (string, error) {
			if *tries++; *tries == 1 {
				return "", context.DeadlineExceeded // as when no answer came in time
			}
			return "answer", nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var tries int
	if v, err := retryUnanswered(ctx, unansweredOnce(&tries)); v != "answer" || err != nil || tries != 2 {
		t.Errorf("unanswered once: got %q, %v after %d tries; want the answer after 2", v, err, tries)
	}
	tries = 0
	if _, err := retryUnanswered(context.Background(), unansweredOnce(&tries)); !errors.Is(err, context.DeadlineExceeded) || tries != 1 {
		t.Errorf("no deadline: got %v after %d tries; want the timeout after 1", err, tries)
	}
	refused := errors.New("stream not found")
	tries = 0
	if _, err := retryUnanswered(ctx, func(context.Context) (string, error) { tries++; return "", refused }); err != refused || tries != 1 {
		t.Errorf("refused: got %v after %d tries; want it after 1", err, tries)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	tries = 0
	_, err := retryUnanswered(short, func(ctx context.Context) (string, error) { tries++; <-ctx.Done(); return "", ctx.Err() })
	if !errors.Is(err, context.DeadlineExceeded) || tries != 1 {
		t.Errorf("ctx ended: got %v after %d tries; want its end after 1", err, tries)
	}
}
