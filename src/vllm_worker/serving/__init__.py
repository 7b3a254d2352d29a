"""The job side: `handler` relays jobs to vLLM's OpenAI server and answers with the cause when there
is no engine; `job_input` turns a job's input into a request; `platform` is every contact with the
runpod SDK (job loop, local API, local test)."""

__all__ = ["handler", "job_input", "platform"]
