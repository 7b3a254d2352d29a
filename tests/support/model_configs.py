"""Real models' config.json fields and safetensors counts, shared by the capacity tests.

meta-llama/Llama-3.1-8B-Instruct and -70B-Instruct: the fields the planner reads, and the
parameter counts the Hub reports for their safetensors.
"""

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
LLAMA_31_8B_PARAMS = {"BF16": 8030261248}
LLAMA_31_70B = {**LLAMA_31_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                "num_hidden_layers": 80}
LLAMA_31_70B_PARAMS = {"BF16": 70553706496}
