"C
&job-1"stdout*2step 1 loss 2.3
job-1"stderr2warnP