"""The job side: `handler` is a job's entry (the status job, the answer when there is no engine, one
loop over the sends); `exchange` sends one request and relays its answer (`stream_relay`: whole SSE
events, posted a few times a second); `after_death` decides what a job does when its request fails;
`relayed_job` holds what the job sends and has sent; `continuation` continues a stream on a
restarted engine; `answers` words every failure; `job_input` turns a job's input into a request;
`platform` is every contact with the runpod SDK (job loop and its drain on SIGTERM, local API, local
test, fresh workers); `fresh_machine` decides when a fault of the machine asks for a fresh worker,
within a bound; `engine_load` reads how the engine copes from vLLM's /metrics; `intake` decides from
those figures how many jobs to take now; `state.WorkerState` is what the job side and the engine's
monitor share (the last death as a typed `Death`)."""

__all__ = [
    "after_death", "answers", "continuation", "engine_load", "exchange", "fresh_machine", "handler", "intake",
    "job_input", "platform", "relayed_job", "state", "stream_relay",
]
