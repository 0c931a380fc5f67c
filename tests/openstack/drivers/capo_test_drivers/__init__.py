"""capo-rs's test drivers for its real OpenStack test tier (tests/openstack/up.sh)."""
