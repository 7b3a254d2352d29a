"""Where the model is: on disk already (`cache`: Runpod's model cache or HF_HUB_CACHE, served
offline), or on the Hub, asked once before anything is launched (`preflight`)."""

__all__ = ["cache", "preflight"]
