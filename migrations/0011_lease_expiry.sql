-- The lease gets an expiry (issue 11): the holder renews `expires_at` every few seconds from a
-- dedicated session whose pid it records. A standby takes the lease over once it expired (a
-- frozen holder: SIGSTOP, a hung host) or once the recorded session is gone (a killed holder),
-- bumping the epoch, which fences every write of the old holder (migration 0006). The session
-- advisory lock of 0006 is no longer used: a frozen holder keeps its session, and so the lock,
-- for ever.
ALTER TABLE instance_lease
    ADD COLUMN expires_at  TIMESTAMPTZ,
    ADD COLUMN renewed_at  TIMESTAMPTZ,
    ADD COLUMN backend_pid INTEGER;
