"""The ground floor: this process's place in the job (``group``) and the collectives every
rank uses to agree (``collectives``), and how a global batch is shared out among ranks
(``shares``). Imports nothing of fwk but its errors."""
