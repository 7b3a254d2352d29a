"""The job side: `handler` relays jobs to vLLM's OpenAI server and answers with the cause when there
is no engine; `stream_relay` cuts vLLM's stream into whole events, posted a few times a second;
`job_input` turns a job's input into a request; `platform` is every contact with the
runpod SDK (job loop and its drain on SIGTERM, local API, local test, fresh workers); `fresh_machine`
decides when a fault of the machine asks for a fresh worker, within a bound; `engine_load` reads how
the engine copes from vLLM's /metrics; `intake` decides from those figures how many jobs to take
now; `state.WorkerState` is what the job side and the engine's monitor share."""

__all__ = ["engine_load", "fresh_machine", "handler", "intake", "job_input", "platform", "state", "stream_relay"]
