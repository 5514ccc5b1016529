"""Who is stuck, and where: heartbeats, hang files, the order of a step, `rankscope top`."""
