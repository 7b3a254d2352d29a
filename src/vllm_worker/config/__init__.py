"""What the user asked for: every environment string of a start is read here, once.

- `env`: how one string is read (blank is unset, true/false words, human integers, shell words);
- `settings`: the worker's own variables (timeouts, concurrency, the engine command, the volume);
- `profile`: `LaunchProfile`, the launch configuration typed, and `ProfileChange`, what a relaunch changes;
- `args_builder`: vLLM's option table (`vllm_flags.json`), its spellings and checks;
- `command`: the `vllm serve` argv rendered from a profile;
- `engine_env`: the engine's environment beside the argv (the worker's own variables out, caches in);
- `flag_messages`: the sentences for a flag value vLLM would refuse or a name that only looks like a flag;
- `official_worker`: what each variable of Runpod's official vLLM worker does here (taken, folded or answered);
- `versions`: the vLLM release the worker is built and tested against.

This folder imports nothing else of the package: every other folder takes its typed values.
"""

__all__ = ["args_builder", "engine_env", "flag_messages", "official_worker", "profile", "settings", "versions"]
