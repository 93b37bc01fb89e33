"""GPU inventory, the pure allocator, and database leases."""
