"""Where the model is: on disk already (`cache`: Runpod's model cache or HF_HUB_CACHE, served
offline), or on the Hub, asked once before anything is launched (`preflight`), and what the engine will
fetch from it and how fast (`hub_rate`)."""

__all__ = ["cache", "hub_rate", "preflight"]
