package queue_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server"
)

// Embedding jobq: an embedded server, the provisioned objects, a Go handler
// and one job through it.
func ExampleNewPool() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "jobq-example-")
	defer os.RemoveAll(dir)

	srv, err := server.Start(ctx, server.Config{StoreDir: dir, Logger: zerolog.Nop()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown(ctx)
	nc, _ := srv.Connect()
	defer nc.Close()
	js, _ := jetstream.New(nc)
	obj, err := queue.Provision(ctx, js, queue.Config{Workers: 2}, zerolog.Nop())
	if err != nil {
		fmt.Println(err)
		return
	}

	done := make(chan string, 1)
	r := handlers.NewRouter()
	r.HandleFunc("job.email.*", func(ctx context.Context, job *data.Job) error {
		done <- fmt.Sprintf("sent %s to %s (attempt %d)", job.ID, job.Payload, job.Attempt)
		return nil
	})
	pool := queue.NewPool(obj, r, zerolog.Nop())
	pool.Start(ctx)
	defer pool.Stop(ctx)

	queue.NewProducer(js, obj.Config).Enqueue(ctx, "job.email.welcome", []byte("ana@example.com"), queue.EnqueueOptions{ID: "welcome-ana"})
	select {
	case msg := <-done:
		fmt.Println(msg)
	case <-time.After(10 * time.Second):
		fmt.Println("timed out")
	}
	// Output: sent welcome-ana to ana@example.com (attempt 1)
}
