"""Why the engine failed to start, in one sentence a user can act on.

Placeholder: the shared Hub-access messages are fixed first so the pre-flight
can import them; the classifier follows.
"""

from __future__ import annotations


def repo_not_found_message(repo: str, variable: str = "MODEL_NAME") -> str:
    """The repository does not exist on the Hub (or is private and invisible to the token)."""
    return (
        f"{variable}={repo!r} was not found on the Hugging Face Hub: check the spelling "
        f"(owner/name, case-sensitive); if the repository is private, set HF_TOKEN to a token "
        f"of an account that can read it."
    )


def gated_repo_message(repo: str, variable: str = "MODEL_NAME", token_set: bool = False) -> str:
    """The repository is gated and the token (or its absence) does not grant access."""
    if token_set:
        fix = (
            f"the account of HF_TOKEN has not been granted access: accept the model's terms "
            f"at https://huggingface.co/{repo} with that account (approval can take a while), "
            f"or use a token of an account that has access"
        )
    else:
        fix = (
            f"HF_TOKEN is not set: accept the model's terms at https://huggingface.co/{repo} "
            f"and set HF_TOKEN to a read token of that account"
        )
    return f"{variable}={repo!r} is a gated repository and {fix}."


def revision_not_found_message(repo: str, revision: str, variable: str = "MODEL_REVISION") -> str:
    """The branch, tag or commit does not exist in the repository (e.g. lost to a force-push)."""
    return (
        f"{variable}={revision!r} does not exist in {repo!r}: set it to an existing branch, "
        f"tag or commit of that repository, or unset it to use the default branch."
    )


def unauthorized_message(repo: str, variable: str = "MODEL_NAME", token_set: bool = False) -> str:
    """The Hub refused the credentials (401)."""
    if token_set:
        return (
            f"The Hugging Face Hub rejected HF_TOKEN while fetching {variable}={repo!r}: the token "
            f"is invalid, expired or revoked; set HF_TOKEN to a valid read token."
        )
    return (
        f"The Hugging Face Hub refused anonymous access to {variable}={repo!r}: if the repository "
        f"is private or gated, set HF_TOKEN to a read token of an account that can read it; "
        f"otherwise check the name."
    )
