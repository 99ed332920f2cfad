# plot_models_peer.gp — `bench/models_peer.sh`: time to first token of each
# request of one round (6 turns on model A, one request on model B, turn 7 on
# A), kvstash beside llama-server's router mode, both with --models-max 1.
# usage: gnuplot -e "csv='bench/out/models_peer.csv'; out='docs/img/models_peer.png'" bench/plot_models_peer.gp
# CSV columns: 1 request, 2 kvstash TTFT (ms), 3 llama-server TTFT (ms), 4 ratio
if (!exists("csv")) csv = 'bench/out/models_peer.csv'
if (!exists("out")) out = 'docs/img/models_peer.png'
set datafile separator ','
set terminal pngcairo size 960,560 font ',10'
set output out
set title "two models, one loaded at a time (--models-max 1): TTFT per request, medians of 5 rounds\n(bench = A, bench-q4k = B; turn 7 comes after B took A's place: kvstash reads A's conversation back from its store)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set yrange [100:*]
set ylabel 'TTFT (ms, log scale)'
set format y '%g'
set grid ytics mytics
set xtics rotate by -20
set key top right opaque box
plot csv every ::1 using 2:xtic(1) title 'kvstash' lc rgb '#1f77b4', \
     '' every ::1 using 3 title 'llama-server (router)' lc rgb '#d62728'
