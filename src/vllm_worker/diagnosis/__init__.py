"""Why a start failed, and what to tell the user: the cause, its value, and the fix that remains.

- `startup_errors`: the entry (`explain`, `classify`, `memory_shortfall`) for a failed launch;
- `rules`: the wordings of vLLM, torch and huggingface_hub as one table of data (`fault_rules`:
  its family of machine, image and model-file faults, and the `Rule` type);
- `verdict`: the `Diagnosis` type and the pieces every sentence shares;
- `memory`: out of memory, memory held by another process, the profiling race;
  `refused_settings`: a value vLLM refused; `hub`: the model could not be fetched (the Hub's
  sentences, shared with the pre-flight, beside the builders); `runtime`: an engine that died
  or hung while serving.

Pure functions over text and a profile; imports only `config`.
"""

__all__ = ["fault_rules", "hub", "memory", "refused_settings", "rules", "runtime", "startup_errors", "verdict"]
