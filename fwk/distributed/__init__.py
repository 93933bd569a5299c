"""The ground floor: this process's place in the job, the collectives every rank uses to agree,
and how a global batch is shared out among ranks.

``group`` holds the place, ``collectives`` the collectives and ``shares`` the shares. The
package imports nothing of fwk but its errors."""
