# python port_in_use.py : a second store on a port that is already taken
import datetime, torch.distributed as dist
s1 = dist.TCPStore("127.0.0.1", 29612, 1, True, timeout=datetime.timedelta(seconds=5))
s2 = dist.TCPStore("127.0.0.1", 29612, 1, True, timeout=datetime.timedelta(seconds=5))
