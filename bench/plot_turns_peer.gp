# plot_turns_peer.gp — `bench/turns_peer.sh`: time to first token per turn of one
# multi-turn conversation sent side by side to kvstash and llama-server (and any
# other server measured), one line per server.
# usage: gnuplot -e "csv='bench/out/turns_peer_ttft.csv'; out='docs/img/turns_peer.png'; n=2; subtitle='...'" bench/plot_turns_peer.gp
# CSV columns: 1 turn, 2..n+1 the TTFT (ms) of each server (header = its short name)
if (!exists("csv")) csv = 'bench/out/turns_peer_ttft.csv'
if (!exists("out")) out = 'docs/img/turns_peer.png'
if (!exists("n")) n = 2
if (!exists("ttl")) ttl = 'time to first token per turn: one conversation, each server keeping its own history (HTTP, streamed)'
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set key autotitle columnhead
set terminal pngcairo size 960,600 font ',10'
set output out
set title ttl."\n".subtitle
set logscale y
set ylabel 'TTFT (ms, log scale)'
set xlabel 'turn (1 = cold: nothing of the conversation cached)'
set grid ytics mytics xtics
set xtics 1
set format y '%g'
set key top left opaque box
colors = '#1f77b4 #d62728 #ff7f0e #2ca02c #9467bd #8c564b'
plot for [i=2:n+1] csv using 1:i with linespoints lw (i == 2 ? 2.5 : 1.5) pt (i == 2 ? 7 : i + 3) \
     dt 0 + (i == 2 ? 1 : i - 1) lc rgb word(colors, i - 1) title columnhead(i)
