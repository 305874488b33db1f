"""Every bound of the core, named once.

The HTTP layer validates every request against these before proposing. The core checks again
every bound on how much the replicated state holds (counts of spaces, mailboxes, runs, children,
tasks; attempts; leases; tick work), so a bug in one layer cannot grow the state without limit;
the sizes of single values (payloads, names, keys, messages) are checked by the HTTP layer only.
"""

from __future__ import annotations

KIB = 1024

# Payloads (task input, task result), measured as compact JSON bytes.
payload_bytes_max = 64 * KIB
# One HTTP request body; how deeply its JSON may nest (a payload's depth counts from the body's).
body_bytes_max = 256 * KIB
json_depth_max = 64

# Names and keys.
name_chars_max = 128
key_chars_max = 512
error_message_chars_max = 2 * KIB

# Named root runs (PUT /runs/{name}): a name's length; names a space remembers.
run_name_chars_max = 256
run_names_per_space_max = 10_000

# Spaces, mailboxes, runs, tasks.
spaces_max = 1_000
space_id_chars_max = 128
mailboxes_per_space_max = 1_000
runs_per_space_max = 100_000
child_limit_default = 1_000
child_limit_max = 100_000
run_depth_max = 32
tasks_per_run_max = 100_000
tasks_per_space_max = 1_000_000
# What tasks and once entries hold, in bytes (storage.py: a fixed overhead each, plus payloads,
# keys and errors): per space, and for the whole node. Past either, new ones are refused.
GIB = 1024 * 1024 * KIB
space_bytes_max = 2 * GIB
node_bytes_max = 8 * GIB

# API keys: per space, revoked ones included (a key is never removed, so its id stays taken).
keys_per_space_max = 1_000

# Once: keys per run; the attempt limit of a failure that names none.
once_per_run_max = 100_000
once_attempts_default = 3
# Claims (fenced mutex leases): keys per run; a release's observation, as compact JSON bytes.
claims_per_run_max = 100_000
observation_bytes_max = 4 * KIB

# Barriers and timers: per run; a barrier's target; how far ahead a timer may be set.
barriers_per_run_max = 10_000
barrier_target_max = 10_000
timers_per_run_max = 10_000
timer_ms_max = 365 * 24 * 3_600_000
# Named barriers and timers (PUT /barriers/by-name/{name}, PUT /timers/by-name/{name}): a name's
# length (the published clients' names are 1 to 256 characters). Named ones are barriers and
# timers of their run, so barriers_per_run_max and timers_per_run_max bound how many names a run
# holds. POST /timers/poll answers at most timers_poll_max fired timers, oldest firing first.
barrier_timer_name_chars_max = 256
timers_poll_max = 1_000

# Deliveries and leases.
lease_ms_default = 30_000
lease_ms_min = 100
lease_ms_max = 3_600_000
receive_batch_max = 100
attempts_default = 5
attempts_max = 100
retry_backoff_ms_base = 1_000
retry_backoff_ms_max = 60_000
retry_delay_ms_max = 3_600_000

# Runs.
deadline_ms_max = 365 * 24 * 3_600_000  # a deadline at most a year ahead
retention_ms_default = 7 * 24 * 3_600_000

# Ticks: how many due entries one tick command processes; the rest wait for the next tick.
tick_entries_max = 10_000

# Batch calls of the API: tasks per batch submit, task ids per batch result wait, deliveries per
# batch complete.
submit_batch_max = 100
results_batch_max = 100
complete_batch_max = 100

# One replicated batch.
batch_commands_max = 1_000

# Task groups.
group_members_max = 100  # members of one group; also the largest threshold and expectedMembers

# Resources: pools of slots, rate limits, spend budgets (resources.py).
resources_per_space_max = 1_000  # of each kind
pool_size_max = 10_000  # slots of one pool; also how many it can have in use
limit_units_max = 1_000_000_000
limit_interval_ms_min = 1
limit_interval_ms_max = 24 * 3_600_000
# Takes a rate limit remembers (one entry per ms at most). Beyond it, it forgets the takes its
# window no longer counts, then counts the rest in coarser steps of time (stricter, never looser).
limit_takes_max = 1_000
budget_total_micros_max = 10**15  # a billion units of the budget's currency
reservations_per_budget_max = 10_000  # reservations held at once; more wait like a full budget
# Permits (permits.py: pools on the protocol's wire): a grant holds 1 to pool_size_max units.
# Waiters in one permit's line at once; waiters one run creates (ended ones count until the run is
# removed); a waiter's TTL, given or default; how long a signaled waiter's units stay set aside
# for it (it polls about every second).
permit_waiters_per_permit_max = 10_000
permit_waiters_per_run_max = 10_000
permit_waiter_ttl_ms_default = 60_000
permit_waiter_ttl_ms_max = 3_600_000
permit_waiter_signaled_ms = 30_000
# Work limits (work_limits.py): per space; a limit's maxOutstanding (no more than a space's tasks).
work_limits_per_space_max = 1_000
work_limit_outstanding_max = tasks_per_space_max
# Budgets on the protocol (budgets.py): money in integer minor units of a currency, `scale`
# digits after the point (scale 2 counts cents). The largest limit, and so the largest amount.
budget_limit_minor_max = 10**18
budget_scale_max = 9
budget_scale_default = 2
budget_currency_default = "USD"
budget_micro_scale = 6  # the old routes count micro-units: a budget they create has this scale
budget_settle_by_ms_default = 3_600_000  # a reservation's settleBy when it names none: now + 1 h
# The latest settleBy: now + a day. Each reservation arms one due entry at its settleBy, kept in the
# heap until then even when the reservation ends first: this bounds how long. (A reservation past
# it is STALE and still settles, so a longer one buys nothing.)
budget_settle_by_ms_max = 24 * 3_600_000
budget_settles_per_reservation_max = 100  # settles (workKeys) of one reservation
budget_work_key_chars_max = 128  # a settle's or void's workKey (0.3.0 sends "settle:<reservation id>")
budget_ended_kept_max = 1_000  # ended reservations a budget keeps for reads and repeats, oldest dropped
budget_reservations_per_job_max = 2  # requirements.budgets entries of one job
# Allowances (allowances.py: rate limits on the protocol's wire). Waiters in one allowance's line
# at once; waiters one run creates (ended ones count until the run is removed); a waiter's TTL,
# given or default. A cooldown's length. Consumptions an allowance remembers to be settled, and
# for how long after they were taken (past either, settle is NOT_FOUND); a cooldown's reason.
allowance_waiters_per_allowance_max = 10_000
allowance_waiters_per_run_max = 10_000
allowance_waiter_ttl_ms_default = 60_000
allowance_waiter_ttl_ms_max = 3_600_000
allowance_cooldown_ms_max = 24 * 3_600_000
allowance_consumptions_per_allowance_max = 10_000
allowance_consumption_settle_ms = 3_600_000
allowance_reason_chars_max = 1_024
needs_slots_max = 16  # slot entries of one job's needs (a pool named twice takes two slots)
blocked_queues_max = 1_000  # queues a resource remembers to wake when something of it returns
receive_scan_max = 1_000  # queue entries one receive looks at
admit_runs_max = 1_000  # runs one admit with includeDescendants looks into
backlog_limit_max = 1_000_000  # a mailbox's backlogLimit
subscribers_per_task_max = 100  # join/detach: subscribers of one task
wait_ms_max = 3_600_000  # the largest waitMs a request may name (the node holds it at most LONG_POLL_MS_MAX)
messages_list_max = 1_000  # GET /mailboxes/{id}/messages: the newest this many
# The list reads (GET /scopes, /tasks, /task-groups, /barriers, /timers): a page holds at most
# list_page_max entries, list_page_default when the request names no limit; a cursor is at most
# list_cursor_chars_max characters. A page reads at most about list_scan_max entries below its
# cursor (then it answers what it found, possibly nothing, with a nextCursor to read on from).
list_page_max = 500
list_page_default = 50
list_cursor_chars_max = 256
list_scan_max = 10_000
# Diagnostics (ops.py): the runs of a subtree one view walks; the entries of each list it answers.
ops_runs_max = 1_000
ops_entries_max = 1_000
# GET /ops/waits looks for jobs short of a resource among the space's oldest QUEUED tasks, at most
# this many (a task without needs costs a lookup; jobs with equal needs share one check).
ops_queued_scan_max = 20_000

# GET /metrics: per-queue and per-resource series it answers at most (each); past it, the deepest
# queues and the resources with the most waiters are kept, and runstate_series_dropped counts the rest.
metrics_series_max = 1_000

# Idempotency keys (the `idempotency-key` header of a mutation): what a space remembers of them.
idempotency_keys_per_space_max = 10_000  # the oldest is forgotten first
idempotency_key_ttl_ms = 3_600_000  # a key is remembered for an hour after its first use
idempotency_bytes_per_space_max = 8 * 1024 * KIB  # what its remembered results weigh; the oldest go first
idempotency_key_chars_max = 255

# Events (events.py): a space's log keeps at most events_per_space_max entries (the oldest dropped
# first, in the step that appends) and drops entries older than event_age_ms_max, by the tick, at
# most event_prune_interval_ms after they reach that age. A page (GET /events, GET /watch) holds
# at most events_page_max events, events_page_default when the request names no limit; a watch
# filters on at most event_types_max types. What a space's log weighs (state.event_bytes: a fixed
# overhead, ids and payload) is bounded too: past event_bytes_per_space_max the oldest go first.
events_per_space_max = 10_000
event_bytes_per_space_max = 8 * 1024 * KIB
event_age_ms_max = 3_600_000
event_prune_interval_ms = 60_000
events_page_max = 1_000
events_page_default = 100
event_types_max = 32
