"""What one prefill records for the methods: window queries, h2o sums, query statistics."""
