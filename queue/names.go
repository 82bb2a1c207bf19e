package queue

// The JetStream objects jobq provisions. Any NATS client sees them by these
// names: `nats stream info JOB`, `nats consumer next JOB WORKER`,
// `nats kv get processed KEY`.
const (
	// StreamJob is the work-queue stream that stores jobs until they are
	// acknowledged.
	StreamJob = "JOB"
	// SubjectJobs is the subject filter of StreamJob; every job's subject
	// starts with "job.".
	SubjectJobs = "job.>"
	// ConsumerWorker is the durable pull consumer every worker, in this
	// process or outside it, fetches jobs from.
	ConsumerWorker = "WORKER"
	// BucketProcessed is the KV bucket of the job ledger, one record per job
	// ID (see data.Ledger).
	BucketProcessed = "processed"
	// StreamDLQ keeps every dead-lettered job under SubjectDLQPrefix and its
	// original subject, with headers that say why.
	StreamDLQ = "DLQ"
	// SubjectDLQPrefix is prepended to a dead-lettered job's subject.
	SubjectDLQPrefix = "dlq."
	// AdvisoryMaxDeliveries is the server's advisory for a WORKER message
	// whose deliveries ran out.
	AdvisoryMaxDeliveries = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + StreamJob + "." + ConsumerWorker
	// advisoryJobStreamDeleted is the server's advisory for JOB deleted.
	advisoryJobStreamDeleted = "$JS.EVENT.ADVISORY.STREAM.DELETED." + StreamJob
)

// Headers jobq sets on dead letters, beside the job's own headers.
const (
	HeaderJobID    = "Jobq-Job-Id"
	HeaderSubject  = "Jobq-Subject"
	HeaderSeq      = "Jobq-Seq"
	HeaderAttempts = "Jobq-Attempts"
	HeaderError    = "Jobq-Error"
	HeaderFailedAt = "Jobq-Failed-At"
)
