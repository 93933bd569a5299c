"""The ground floor: this process's place in the job (``group``) and the collectives every
rank uses to agree (``collectives``). Imports nothing of fwk but its errors."""
