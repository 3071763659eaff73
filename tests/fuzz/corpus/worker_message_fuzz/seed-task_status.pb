B
t1job-1 (ÿÿÿÿÿÿÿÿÿ0	:	Traceback:
CUDA errorJrank 2 diedPP