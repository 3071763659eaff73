2
job-1t1OOMP