"""What one checkpoint of a job holds, from the job's description alone: no store, no time, no measurement."""
