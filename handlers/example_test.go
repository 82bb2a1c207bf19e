package handlers_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

func ExampleRouter() {
	r := handlers.NewRouter()
	for _, pattern := range []string{"job.>", "job.email.*", "job.email.welcome"} {
		err := r.HandleFunc(pattern, func(_ context.Context, job *data.Job) error {
			fmt.Printf("%s ran %s\n", pattern, job.Subject)
			return nil
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}

	ctx := context.Background()
	for _, subject := range []string{"job.email.welcome", "job.email.bye", "job.sms"} {
		if err := r.Process(ctx, &data.Job{Subject: subject}); err != nil {
			fmt.Println(err)
		}
	}
	err := r.Process(ctx, &data.Job{Subject: "orders.new"})
	fmt.Println(err)
	fmt.Println(errors.Is(err, handlers.ErrNoRoute), handlers.IsPermanent(err))
	// Output:
	// job.email.welcome ran job.email.welcome
	// job.email.* ran job.email.bye
	// job.> ran job.sms
	// no handler for subject "orders.new"
	// true true
}

func ExampleRouter_Use() {
	r := handlers.NewRouter()
	r.Use(func(next handlers.Handler) handlers.Handler {
		return handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
			err := next.Process(ctx, job)
			fmt.Printf("%s attempt %d: %v\n", job.Subject, job.Attempt, err)
			return err
		})
	})
	_ = r.HandleFunc("job.email", func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("no recipient"))
	})
	_ = r.Process(context.Background(), &data.Job{Subject: "job.email", Attempt: 1})
	// Output:
	// job.email attempt 1: no recipient
}

func ExampleParseRoute() {
	r := handlers.NewRouter()
	for _, flag := range []string{"job.email.*=exec:./send.sh", "job.>=log", "orders.new=log"} {
		pattern, spec, err := handlers.ParseRoute(flag)
		if err != nil {
			fmt.Println(err)
			continue
		}
		h, err := handlers.ParseSpec(spec, zerolog.Nop())
		if err != nil {
			fmt.Println(err)
			continue
		}
		if err := r.Handle(pattern, h); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println(r.Patterns())
	// Output:
	// handler subject "orders.new" matches no subject under "job.": want SUBJECT=SPEC, e.g. job.email=exec:./send.sh
	// [job.> job.email.*]
}
